"""The committed tiny Flux photos model: loaded through ComfyUI's own Flux classes (double and single blocks), it
samples deterministically pictures whose colour and texture statistics are those of the prompted class's crops and
not another's, classifier-free guidance and the class change them, its fixed decoder is lossy, and through the
Cached Sampler caching switched off is bit-identical with the model doing all its work, counted at the block
hooks, while caching that skips saves work and stays close."""
import math
import os

import pytest
import torch

from cached_sampler_dev.support import graphs
from cached_sampler_dev.devkit.work_nodes import CAPTURED, CountWork

pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WEIGHTS = os.path.join(ROOT, "assets", "tiny_flux_photos.safetensors")
CLASSES = "0257"  # sky, trees, whole flower, bud
STEPS = 20


@pytest.fixture(scope="module")
def photos_model(comfy):
    if not os.path.isfile(WEIGHTS):
        pytest.skip("tiny_flux_photos.safetensors missing (run python3 -m cached_sampler_dev.training.train_photos_model)")
    return comfy.module("nodes.demo_models.photos")


@pytest.fixture(scope="module")
def model(photos_model):
    return photos_model.load_model()


@pytest.fixture(scope="module")
def samples(photos_model, model):
    """Two pictures per class (euler, 20 steps, cfg 3, seed 0), decoded: (labels, images [16, 3, 48, 48])."""
    labels = [c for _ in range(2) for c in range(photos_model.NUM_CLASSES)]
    latent = photos_model.sample_photos(model, labels, steps=STEPS, cfg=3.0, seed=0)
    assert torch.isfinite(latent).all()
    return labels, photos_model.decode_images(latent)


def test_model_is_comfyui_flux_with_double_and_single_blocks_loaded_strictly(photos_model, model):
    import comfy.ldm.flux.model
    import comfy.model_base
    import comfy.supported_models

    assert os.path.realpath(photos_model.WEIGHTS_PATH) == os.path.realpath(WEIGHTS)
    assert os.path.getsize(WEIGHTS) < 15 * 2 ** 20
    assert isinstance(model.model, comfy.model_base.Flux)
    assert model.model.model_type == comfy.model_base.ModelType.FLOW
    # many-step: a Flux config with schnell's sampling, not a subclass of the step-distilled one
    assert isinstance(model.model.model_config, comfy.supported_models.Flux)
    assert not isinstance(model.model.model_config, comfy.supported_models.FluxSchnell)
    net = model.model.diffusion_model
    assert isinstance(net, comfy.ldm.flux.model.Flux)
    assert len(net.double_blocks) == photos_model.DEFAULT_UNET_CONFIG["depth"] > 0
    assert len(net.single_blocks) == photos_model.DEFAULT_UNET_CONFIG["depth_single_blocks"] > 0
    tensors, _ = photos_model.loader.read_file(WEIGHTS)
    state = net.state_dict()
    stored = {k[len("diffusion_model."):]: v for k, v in tensors.items() if k.startswith("diffusion_model.")}
    assert len(stored) == len(state)
    assert all(torch.equal(state[k], v) for k, v in model.model.model_config.process_unet_state_dict(stored).items())


def test_crops_are_photographs_and_the_decoder_is_fixed_and_lossy(photos_model):
    labels = torch.arange(32) % photos_model.NUM_CLASSES
    crops = photos_model.make_crops(labels, torch.Generator().manual_seed(5))
    assert crops.shape == (32, 3, photos_model.PIXELS, photos_model.PIXELS)
    assert float(crops.std(dim=(2, 3)).mean()) > 0.03  # pictures, not flat colour
    latent = photos_model.encode(crops)
    assert latent.shape == (32, 16, photos_model.LATENT_SIZE, photos_model.LATENT_SIZE)
    assert latent.numel() < crops.numel()  # fewer latent values than pixels: the decoder cannot be exact
    decoded = photos_model.decode_images(latent)
    psnr = 10 * math.log10(1 / float(((decoded - crops) ** 2).mean()))
    assert 24.0 < psnr < 40.0, psnr  # close, but the fine detail is lost
    raw = photos_model.raw_latent(crops)
    assert torch.allclose(photos_model.raw_latent(photos_model.loader.patch_decode(raw)), raw, atol=1e-4)  # projection
    image = photos_model.decode(latent)
    assert image.shape == (32, photos_model.IMAGE_SIZE, photos_model.IMAGE_SIZE, 3)
    assert float(image.min()) >= 0.0 and float(image.max()) <= 1.0
    # the check the samples are held to tells the classes' crops apart, and fails wrong labels
    assert photos_model.class_accuracy(decoded, labels.tolist()) >= 0.8
    assert photos_model.class_accuracy(decoded, ((labels + 1) % photos_model.NUM_CLASSES).tolist()) <= 0.2


def test_samples_are_deterministic_and_look_like_their_class(photos_model, model, samples):
    labels, images = samples
    again = photos_model.decode_images(photos_model.sample_photos(model, labels, steps=STEPS, cfg=3.0, seed=0))
    assert torch.equal(images, again)
    # what the bench's accuracy column reads: 0.75 here (12 of 16), 1/8 for the untrained network, 0 with the
    # class tables shifted by one class
    assert photos_model.class_accuracy(images, labels) >= 0.6
    # per class: its samples' statistics are nearer to its own crops' than to the other classes' on average
    distances = photos_model.class_distances(images)
    labels_t = torch.tensor(labels)
    for c in range(photos_model.NUM_CLASSES):
        rows = distances[labels_t == c]
        own = rows[:, c].mean()
        others = torch.cat([rows[:, :c], rows[:, c + 1:]], dim=1).mean()
        assert own < others, (c, float(own), float(others))


def test_samples_are_textured_like_the_crops_not_blobs(photos_model, samples):
    """The fine grain (mean absolute difference of neighbouring luminance values) of the samples is of the order
    of their classes' crops', class by class where the crops have texture: a model that draws smooth blobs of the
    right colour fails it, and so does one that leaves noise (the untrained network's grain is 16x the crops')."""
    labels, images = samples
    centroids, _ = photos_model.class_centroids()
    fine = photos_model.features(images)[:, 6]
    expected = centroids[torch.tensor(labels), 6]
    textured = expected > 0.02
    assert textured.sum() >= 8
    ratio = fine[textured] / expected[textured]
    assert 0.5 < float(ratio.mean()) < 2.5 and float(ratio.min()) > 0.25, ratio


def test_classes_and_guidance_change_the_pictures(photos_model, model):
    same_class = photos_model.sample_photos(model, [0] * 4, steps=STEPS, cfg=3.0, seed=3)
    mixed = photos_model.sample_photos(model, [0, 2, 5, 7], steps=STEPS, cfg=3.0, seed=3)
    assert torch.equal(same_class[0], mixed[0])  # same noise, same class: the same picture
    for i in (1, 2, 3):
        assert float((same_class[i] - mixed[i]).abs().mean()) > 0.1, i
    unguided = photos_model.sample_photos(model, [0, 2, 5, 7], steps=STEPS, cfg=1.0, seed=3)
    assert float((unguided - mixed).abs().mean()) > 0.05


# ---------------------------------------------------------------------------- through the executor ----

class PhotosCountWork(CountWork):
    """Counts the work of the photos model's double and single blocks."""

    def groups(self, model, **inputs):
        net = model.model.diffusion_model
        return {"double_block": len(net.double_blocks), "single_block": len(net.single_blocks)}


def _prompt(chain_nodes=None, key="out"):
    return graphs.demo_model_prompt("CachedSamplerPhotosModel", CLASSES, "TestPhotosCountWork", STEPS, chain_nodes, key)


def _run(comfy, prompt, key="out"):
    comfy.run(prompt)
    return CAPTURED.pop(key), CAPTURED.pop(key + "w")


WINDOW = dict(start_percent=0.0, end_percent=1.0)


@pytest.fixture(scope="module")
def uncached(comfy, photos_model):
    import nodes
    nodes.NODE_CLASS_MAPPINGS["TestPhotosCountWork"] = PhotosCountWork
    latent, work = _run(comfy, _prompt())
    return latent, dict(work)


def test_node_runs_through_the_executor_with_every_block(comfy, photos_model, model, uncached):
    latent, work = uncached
    blocks = photos_model.DEFAULT_UNET_CONFIG["depth"] + photos_model.DEFAULT_UNET_CONFIG["depth_single_blocks"]
    assert latent.shape == (len(CLASSES), 16, photos_model.LATENT_SIZE, photos_model.LATENT_SIZE)
    labels = [int(c) for c in CLASSES]
    direct = photos_model.sample_photos(model, labels, steps=STEPS, cfg=3.0, seed=0)
    assert torch.allclose(latent, direct, atol=1e-4)  # the node's setup is the module's (to float rounding on older ComfyUIs)
    assert work["runs"] == 1 and work["forwards"] == STEPS  # cond and uncond in one batch per step
    assert work["blocks"] == STEPS * blocks
    assert work["block_rows"] == STEPS * blocks * 2 * len(CLASSES)


def test_caching_switched_off_is_bit_identical(comfy, uncached):
    latent, work = _run(comfy, _prompt([("CachedSamplerFirstBlockCache", dict(
        threshold=0.0, warmup=0.0, max_cached_steps=-1, max_consecutive_cached=-1, **WINDOW))]))
    assert torch.equal(latent, uncached[0])
    assert work["blocks"] == uncached[1]["blocks"] and work["block_rows"] == uncached[1]["block_rows"]


def test_caching_that_skips_saves_work_and_stays_close(comfy, photos_model, uncached):
    latent, work = _run(comfy, _prompt([("CachedSamplerFixedCadence", dict(interval=2, **WINDOW)),
                                        ("CachedSamplerTaylorSeer", dict(order=1))]))
    assert torch.isfinite(latent).all()
    assert work["blocks"] < 0.8 * uncached[1]["blocks"]
    images, reference = photos_model.decode(latent), photos_model.decode(uncached[0])
    mse = float(((images - reference) ** 2).mean())
    assert 0.0 < mse and 10 * math.log10(1 / mse) > 20.0
