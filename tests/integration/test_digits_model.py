"""The committed tiny Flux digits model samples recognisable digits.

Loads ``assets/tiny_flux_digits.safetensors`` through ComfyUI's own Flux
classes, samples one digit per class with ComfyUI's KSampler code path
(euler, 20 steps, cfg 3, seed 0) and checks a k-NN classifier trained on
sklearn's digits recognises the prompted class.
"""

import os

import pytest

pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WEIGHTS = os.path.join(ROOT, "assets", "tiny_flux_digits.safetensors")


@pytest.fixture(scope="module")
def digits_model(comfy):
    if not os.path.isfile(WEIGHTS):
        pytest.skip("tiny_flux_digits.safetensors missing (run python3 -m cached_sampler_dev.training.train_digits_model)")
    return comfy.module("nodes.demo_models.digits")


def test_weights_path_points_at_assets(digits_model):
    assert os.path.realpath(digits_model.WEIGHTS_PATH) == os.path.realpath(WEIGHTS)


def test_model_is_comfyui_flux(digits_model):
    import comfy.ldm.flux.model
    import comfy.model_base
    import comfy.model_patcher

    model = digits_model.load_model()
    assert isinstance(model, comfy.model_patcher.ModelPatcher)
    assert isinstance(model.model, comfy.model_base.Flux)
    assert isinstance(model.model.diffusion_model, comfy.ldm.flux.model.Flux)
    assert model.model.model_type == comfy.model_base.ModelType.FLOW


def test_samples_one_recognisable_digit_per_class(digits_model):
    import torch

    model = digits_model.load_model()
    labels = list(range(10))
    latent = digits_model.sample_digits(model, labels, steps=20, cfg=3.0, seed=0,
                                        sampler="euler", scheduler="simple")
    assert latent.shape == (10, 16, 8, 8)
    assert torch.isfinite(latent).all()

    digits = digits_model.decode_digits(latent)
    assert digits.shape == (10, 8, 8)
    assert torch.isfinite(digits).all()
    image = digits_model.decode(latent)
    assert image.shape == (10, 64, 64, 3)
    assert float(image.min()) >= 0.0 and float(image.max()) <= 1.0

    accuracy = digits_model.knn_label_accuracy(digits, labels, k=5)
    assert accuracy >= 0.9, f"k-NN label accuracy {accuracy:.2f} < 0.9"
