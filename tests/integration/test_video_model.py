"""The committed tiny Wan 2.1 video model: loaded through ComfyUI's own Wan classes, it samples
deterministically, its videos move in the prompted class's direction and show its shape and colour (and classifier-free guidance matters), its
fixed decoder is lossy, and caching switched off on it through the Cached Sampler is bit-identical with the
model doing all its work, counted at the block hooks."""
import math
import os

import pytest
import torch

from cached_sampler_dev.support import graphs
from cached_sampler_dev.devkit.work_nodes import CAPTURED, CountWork

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WEIGHTS = os.path.join(ROOT, "assets", "tiny_wan_video.safetensors")
CLASSES = "0257"  # square right, square down, disc down, disc up
STEPS = 10


@pytest.fixture(scope="module")
def video_model(comfy):
    if not os.path.isfile(WEIGHTS):
        pytest.skip("tiny_wan_video.safetensors missing (run python3 -m cached_sampler_dev.training.train_video_model)")
    return comfy.module("nodes.demo_models.video")


@pytest.fixture(scope="module")
def model(video_model):
    return video_model.load_model()


def test_weights_path_points_at_assets(video_model):
    assert os.path.realpath(video_model.WEIGHTS_PATH) == os.path.realpath(WEIGHTS)
    assert os.path.getsize(WEIGHTS) < 8 * 2 ** 20


def test_model_is_comfyui_wan_loaded_strictly(video_model, model):
    import comfy.ldm.wan.model
    import comfy.model_base
    import comfy.supported_models

    assert isinstance(model.model, comfy.model_base.WAN21)
    assert isinstance(model.model.model_config, comfy.supported_models.WAN21_T2V)
    net = model.model.diffusion_model
    assert isinstance(net, comfy.ldm.wan.model.WanModel)
    assert len(net.blocks) == video_model.DEFAULT_UNET_CONFIG["num_layers"]
    # every stored weight is the one the network holds (load_model loads strictly)
    tensors, metadata = video_model.loader.read_file(WEIGHTS)
    state = net.state_dict()
    stored = {k[len("diffusion_model."):]: v for k, v in tensors.items() if k.startswith("diffusion_model.")}
    assert set(stored) == set(state)
    assert all(torch.equal(stored[k], state[k]) for k in stored)
    assert sum(p.numel() for p in net.parameters()) < 2_000_000
    assert int(metadata["train_steps"]) > 0 and "sample_check" in metadata and "train_log" in metadata


def test_decoder_is_fixed_lossy_and_consistent(video_model):
    g = torch.Generator().manual_seed(5)
    videos = video_model.make_videos(torch.arange(16) % video_model.NUM_CLASSES, g)
    latent = video_model.encode(videos)
    assert latent.shape == (16, 16, video_model.FRAMES, video_model.LATENT_SIZE, video_model.LATENT_SIZE)
    decoded = video_model.decode_videos(latent)
    mse = float(((decoded - videos) ** 2).mean())
    assert 30.0 < 10 * math.log10(1 / mse) < 45.0  # close, but detail is lost
    raw = video_model.raw_latent(videos)
    assert torch.allclose(video_model.raw_latent(video_model.raw_decode(raw)), raw, atol=1e-4)  # a projection
    image = video_model.decode(latent)
    assert image.shape == (16 * video_model.FRAMES, 64, 64, 3)
    # the generated data the model learnt from is recovered by the same check the samples get
    accuracy, direction = video_model.class_accuracy(videos, (torch.arange(16) % video_model.NUM_CLASSES).tolist())
    assert accuracy == 1.0 and direction == 1.0
    assert video_model.learned_accuracy(videos, (torch.arange(16) % video_model.NUM_CLASSES).tolist()) == 1.0
    wrong = ((torch.arange(16) + 1) % video_model.NUM_CLASSES).tolist()  # every label off by one class
    assert video_model.learned_accuracy(videos, wrong) == 0.0


def test_position_code_reaches_the_network_as_extra_input_channels(video_model, model):
    """A model trained with a position code (``train_video_model --position-code``) takes it as 16 more input
    channels, passed by the conditioning to both branches through Wan's ``concat_latent_image``; the shipped model
    has none, and a model without extra inputs gets nothing more than the class."""
    shipped = video_model.load_tables()
    assert "position_code" not in shipped
    plain = {k: shipped[k] for k in ("class_context", "latent_mean", "latent_std")}
    positive, negative = video_model.class_conditioning([0, 5], plain)
    assert positive[0][1] == {} and negative[0][1] == {}
    assert torch.count_nonzero(video_model.position_code("none")) == 0
    time_code = video_model.position_code("time")
    assert torch.equal(time_code[:, 0], torch.full_like(time_code[:, 0], -1.0))
    assert torch.equal(time_code[:, -1], torch.full_like(time_code[:, -1], 1.0))
    assert (time_code[:, 1:] > time_code[:, :-1]).all()  # later frames read higher, the same all over a frame
    space = video_model.position_code("time+space")
    assert not torch.equal(space[1, :, :, 0], space[1, :, :, -1]) and torch.equal(space[1, 0], space[1, -1])
    config = {**video_model.DEFAULT_UNET_CONFIG, "in_dim": 32}
    coded = video_model.build_model(config, seed=0)
    seen = []
    net = coded.model.diffusion_model
    forward = net.forward_orig
    net.forward_orig = lambda x, *args, **kwargs: seen.append(x.detach().clone()) or forward(x, *args, **kwargs)
    tables = {**plain, "position_code": space}
    latent = video_model.sample_videos(coded, [0, 5], steps=2, cfg=3.0, tables=tables)
    assert latent.shape == (2, 16, video_model.FRAMES, video_model.LATENT_SIZE, video_model.LATENT_SIZE)
    assert len(seen) == 2 and seen[0].shape[:2] == (4, 32)  # cond and uncond rows, latent + code channels
    assert torch.allclose(seen[0][:, 16:], space.expand(4, -1, -1, -1, -1), atol=1e-5)


def test_shipped_model_takes_its_class_path(video_model, model):
    """The shipped model was trained with ``--class-path`` (its samples follow their direction, ``bench/
    video_motion.md``): its file holds the eight paths, its network takes 16 more input channels, and the
    conditioning hands the prompted branch its class's path and the unconditional one zeros."""
    tables = video_model.load_tables()
    assert tables["class_path"].shape == (8, 16, video_model.FRAMES, video_model.LATENT_SIZE, video_model.LATENT_SIZE)
    assert model.model.diffusion_model.patch_embedding.in_channels == 32
    positive, negative = video_model.class_conditioning([1, 6], tables)
    fmt = video_model.latent_format()
    prompted, unconditional = (fmt.process_in(c[0][1]["concat_latent_image"]) for c in (positive, negative))
    assert torch.allclose(prompted, tables["class_path"][[1, 6]], atol=1e-4)
    assert torch.count_nonzero(unconditional.abs() > 1e-4) == 0


def test_class_paths_travel_in_their_class_direction_and_leave_the_negative_branch(video_model):
    """``train_video_model --class-path``: each class's mean latent, a band that moves as the class does, is an input
    of the prompted branch only; the unconditional branch gets zeros there (and the position code, if any)."""
    shipped = video_model.load_tables()
    plain = {k: shipped[k] for k in ("class_context", "latent_mean", "latent_std")}
    labels = torch.arange(512) % video_model.NUM_CLASSES
    videos = video_model.make_videos(labels, torch.Generator().manual_seed(4))
    paths = video_model.class_paths(videos, labels, plain)
    assert paths.shape == (8, 16, video_model.FRAMES, video_model.LATENT_SIZE, video_model.LATENT_SIZE)
    mean, std = plain["latent_mean"].view(1, -1, 1, 1, 1), plain["latent_std"].view(1, -1, 1, 1, 1)
    direction, _ = video_model.classify_videos(video_model.raw_decode(paths * std + mean).clamp(0.0, 1.0))
    assert direction.tolist() == (torch.arange(8) % len(video_model.DIRECTIONS)).tolist()
    space = video_model.position_code("time+space")
    tables = {**plain, "position_code": space, "class_path": paths}
    positive, negative = video_model.class_conditioning([3, 6], tables)
    fmt = video_model.latent_format()

    def model_space(image):  # what Wan's concat_cond hands the network
        return torch.cat([fmt.process_in(chunk) for chunk in image.split(16, dim=1)], dim=1)

    prompted, unconditional = (model_space(c[0][1]["concat_latent_image"]) for c in (positive, negative))
    assert prompted.shape == unconditional.shape == (2, 32, video_model.FRAMES, 8, 8)
    for extra in (prompted, unconditional):
        assert torch.allclose(extra[:, :16], space.expand(2, -1, -1, -1, -1), atol=1e-4)
    assert torch.allclose(prompted[:, 16:], paths[[3, 6]], atol=1e-4)
    assert torch.allclose(unconditional[:, 16:], torch.zeros_like(paths[:2]), atol=1e-4)


def test_samples_are_deterministic_finite_move_and_follow_the_class(video_model, model):
    labels = [int(c) for c in CLASSES]
    first = video_model.sample_videos(model, labels, steps=STEPS, cfg=3.0, seed=0)
    again = video_model.sample_videos(model, labels, steps=STEPS, cfg=3.0, seed=0)
    assert torch.isfinite(first).all()
    assert torch.equal(first, again)
    videos = video_model.decode_videos(first)
    assert video_model.hue_classes(videos).tolist() == labels  # each class has its own colour
    direction, shape = video_model.classify_videos(videos)
    assert float((shape == torch.tensor(labels) // 4).float().mean()) >= 0.75  # squares 0-3, discs 4-7
    assert direction.tolist() == [label % 4 for label in labels], direction  # right, left, down, up
    assert video_model.learned_accuracy(videos, labels) >= 0.75  # what the bench's accuracy column reads
    frames = videos.flatten(2)
    assert float((frames[:, 1:] - frames[:, :-1]).abs().mean()) > 0.005  # consecutive frames differ
    travel = video_model.motion(videos)
    assert float(travel.min()) > 10.0, travel  # the shapes travel, most of the training clips' 16.8 px


def test_classes_and_guidance_change_the_videos(video_model, model):
    same_noise = [0] * 4  # one class, then others, from the same noise
    square_right = video_model.sample_videos(model, same_noise, steps=STEPS, cfg=3.0, seed=3)
    mixed = video_model.sample_videos(model, [0, 3, 4, 7], steps=STEPS, cfg=3.0, seed=3)
    assert torch.equal(square_right[0], mixed[0])
    for i in (1, 2, 3):
        assert float((square_right[i] - mixed[i]).abs().mean()) > 0.05, i
    unguided = video_model.sample_videos(model, [0, 3, 4, 7], steps=STEPS, cfg=1.0, seed=3)
    assert float((unguided - mixed).abs().mean()) > 0.02


class VideoCountWork(CountWork):
    """Counts the work of the video model's blocks (Wan's ``blocks``, hooked as "double_block")."""

    def groups(self, model, **inputs):
        return {"double_block": len(model.model.diffusion_model.blocks)}


def _prompt(chain_nodes=None, steps=STEPS, key="out"):
    return graphs.demo_model_prompt("CachedSamplerVideoModel", CLASSES, "TestVideoCountWork", steps, chain_nodes, key)


def _run(comfy, prompt, key="out"):
    comfy.run(prompt)
    return CAPTURED.pop(key), CAPTURED.pop(key + "w")


WINDOW = dict(start_percent=0.0, end_percent=1.0)
OFF = {
    "fixed cadence 1 + TaylorSeer": [("CachedSamplerFixedCadence", dict(interval=1, **WINDOW)),
                                     ("CachedSamplerTaylorSeer", dict(order=1))],
    "first block cache 0": [("CachedSamplerFirstBlockCache", dict(threshold=0.0, warmup=0.0, max_cached_steps=-1,
                                                                  max_consecutive_cached=-1, **WINDOW))],
}


@pytest.fixture(scope="module")
def uncached(comfy, video_model):
    import nodes
    nodes.NODE_CLASS_MAPPINGS["TestVideoCountWork"] = VideoCountWork
    latent, work = _run(comfy, _prompt())
    return latent, dict(work)


def test_node_runs_through_the_executor_with_every_block(comfy, video_model, uncached):
    latent, work = uncached
    layers = video_model.DEFAULT_UNET_CONFIG["num_layers"]
    assert latent.shape == (len(CLASSES), 16, video_model.FRAMES, video_model.LATENT_SIZE, video_model.LATENT_SIZE)
    assert torch.isfinite(latent).all()
    assert work["runs"] == 1 and work["forwards"] == STEPS  # cond and uncond in one batch per step
    assert work["blocks"] == STEPS * layers
    assert work["block_rows"] == STEPS * layers * 2 * len(CLASSES)


@pytest.mark.parametrize("name", list(OFF))
def test_caching_switched_off_is_bit_identical(comfy, video_model, uncached, name):
    latent, work = _run(comfy, _prompt(OFF[name]))
    assert torch.equal(latent, uncached[0]), name
    assert work["blocks"] == uncached[1]["blocks"] and work["block_rows"] == uncached[1]["block_rows"], name


def test_caching_that_skips_saves_work_and_stays_close(comfy, video_model, uncached):
    latent, work = _run(comfy, _prompt([("CachedSamplerFixedCadence", dict(interval=2, **WINDOW)),
                                        ("CachedSamplerTaylorSeer", dict(order=1))]))
    assert torch.isfinite(latent).all()
    assert work["blocks"] < 0.8 * uncached[1]["blocks"]
    images, reference = video_model.decode(latent), video_model.decode(uncached[0])
    mse = float(((images - reference) ** 2).mean())
    assert 0.0 < mse and 10 * math.log10(1 / mse) > 20.0


def test_agreement_mode_keeps_the_negative_branch_while_the_denoised_predictions_disagree(comfy, video_model, uncached):
    """Adaptive Guidance's agreement stop on a trained flow model: early on, both branches' epsilons are mostly
    the noisy input they share, so their cosine says they agree when the images they point at do not (on this
    model 1 - cos of the epsilons is 0.016 at the first step, under this threshold; of the denoised predictions
    0.49). The agreement is measured on the denoised predictions: the negative branch is computed on every one of
    the first evaluations, and left out once they agree, later in the schedule."""
    latent, work = _run(comfy, _prompt([("CachedSamplerGuidanceCache", dict(
        interval=4, mode="agreement", threshold=0.02, estimate="difference forecast", **WINDOW))]))
    full = uncached[1]["negative_rows"]
    rows = work["negative_rows"]
    assert len(rows) == len(full) == STEPS
    assert rows[:STEPS // 2] == full[:STEPS // 2], rows
    assert sum(rows) < sum(full), rows
    assert torch.isfinite(latent).all()
