"""Demo nodes for the bundled tiny models: a class-conditional Flux trained on 8x8 digits, a class-conditional
Wan 2.1 video model trained on moving shapes, and a class-conditional Flux trained on crops of two photographs.

They let the example workflows, the headless demo and the browser test run anywhere in seconds,
through ComfyUI's real Flux code and sampling loop. Not meant for real images.
"""
from __future__ import annotations

from comfy_api.latest import io

from .demo_models import digits as digits_model, photos as photos_model, video as video_model
from .common import CATEGORY, PREFIX


def parse_digits(text: str, node: str) -> list[int]:
    labels = [int(c) for c in text if c.isdigit()]
    if not labels or any(c not in "0123456789, " for c in text):
        raise ValueError(f"{node}: 'digits' must list digits 0-9, e.g. \"0123456789\"; got {text!r}.")
    return labels


class DigitsModel(io.ComfyNode):
    @classmethod
    def define_schema(cls):
        return io.Schema(
            node_id=f"{PREFIX}DigitsModel",
            display_name="Tiny Digits Model (demo)",
            category=f"{CATEGORY}/demo",
            description=("Loads the pack's bundled tiny Flux model (2.3M parameters, trained on 8x8 handwritten "
                         "digits) with class conditioning and an empty latent: a complete text-to-image setup "
                         "that samples in a fraction of a second on a CPU, for trying caching settings."),
            inputs=[io.String.Input("digits", default="0123456789", tooltip=(
                "Which digits to draw, one image each (the batch), e.g. \"0123456789\" or \"777\"."))],
            outputs=[io.Model.Output(display_name="MODEL", tooltip="The tiny Flux model."),
                     io.Conditioning.Output(display_name="positive", tooltip="Class conditioning per image."),
                     io.Conditioning.Output(display_name="negative", tooltip="Unconditional (for CFG)."),
                     io.Latent.Output(display_name="LATENT", tooltip="An empty latent, one per digit."),
                     io.Vae.Output(display_name="VAE", tooltip=(
                         "The model's fixed decoder, for VAE Decode or Auto Calibrate's vae input."))],
        )

    @classmethod
    def execute(cls, digits: str) -> io.NodeOutput:
        labels = parse_digits(digits, "Tiny Digits Model (demo)")
        positive, negative = digits_model.class_conditioning(labels)
        latent = {"samples": digits_model.empty_latent(len(labels))}
        return io.NodeOutput(digits_model.load_model(), positive, negative, latent, digits_model.DigitsVAE())


class DigitsDecode(io.ComfyNode):
    @classmethod
    def define_schema(cls):
        return io.Schema(
            node_id=f"{PREFIX}DigitsDecode",
            display_name="Tiny Digits Decode (demo)",
            category=f"{CATEGORY}/demo",
            description="Turns latents of the tiny digits model into images (its 'VAE' is a fixed linear map).",
            inputs=[io.Latent.Input("samples", tooltip="Latents sampled with the tiny digits model.")],
            outputs=[io.Image.Output(tooltip="One 64x64 image per latent.")],
        )

    @classmethod
    def execute(cls, samples) -> io.NodeOutput:
        return io.NodeOutput(digits_model.decode(samples["samples"].float()))


def class_model_node(name: str, display_name: str, description: str, classes_tooltip: str, model, vae: type,
                     family: str, what: str, latent_tooltip: str, vae_tooltip: str) -> type[io.ComfyNode]:
    """A loader node of a class-conditional demo model: a ``classes`` text in; the model, the class conditioning,
    an empty latent per class and the model's fixed decoder out. ``model`` is its module in demo_models."""

    class ClassModelNode(io.ComfyNode):
        @classmethod
        def define_schema(cls):
            return io.Schema(
                node_id=f"{PREFIX}{name}", display_name=display_name, category=f"{CATEGORY}/demo",
                description=description,
                inputs=[io.String.Input("classes", default="01234567", tooltip=classes_tooltip)],
                outputs=[io.Model.Output(display_name="MODEL", tooltip=f"The tiny {family} model."),
                         io.Conditioning.Output(display_name="positive", tooltip=f"Class conditioning per {what}."),
                         io.Conditioning.Output(display_name="negative", tooltip="Unconditional (for CFG)."),
                         io.Latent.Output(display_name="LATENT", tooltip=latent_tooltip),
                         io.Vae.Output(display_name="VAE", tooltip=vae_tooltip)],
            )

        @classmethod
        def execute(cls, classes: str) -> io.NodeOutput:
            labels = model.parse_classes(classes, display_name)
            positive, negative = model.class_conditioning(labels)
            latent = {"samples": model.empty_latent(len(labels))}
            return io.NodeOutput(model.load_model(), positive, negative, latent, vae())

    ClassModelNode.__name__ = ClassModelNode.__qualname__ = name
    return ClassModelNode


VideoModel = class_model_node(
    "VideoModel", "Tiny Video Model (demo)",
    "Loads the pack's bundled tiny Wan 2.1 video model (1M parameters, trained on moving shapes: 8 frames of "
    "32x32) with class conditioning, an empty video latent and its fixed lossy decoder: a complete text-to-video "
    "setup that samples in seconds on a CPU, for trying caching settings on a model with motion.",
    "Which videos to make, one each (the batch), by class: 0-3 a square moving right, left, down, up; 4-7 a disc "
    "moving right, left, down, up. E.g. \"01234567\" or \"444\".",
    video_model, video_model.VideoVAE, "Wan 2.1", "video", "An empty 8-frame video latent per class.",
    "The model's fixed lossy decoder, for VAE Decode (8 frames of 64x64 per video, in order) or Auto Calibrate's "
    "vae input.")


PhotosModel = class_model_node(
    "PhotosModel", "Tiny Photos Model (demo)",
    "Loads the pack's bundled tiny Flux model (2.3M parameters, trained on 48x48 crops of two photographs: a pagoda "
    "by a lake and a dahlia) with class conditioning, an empty latent and its fixed lossy decoder: a complete "
    "text-to-image setup on natural images, whose textures make caching harder than on the digits, that samples in "
    "seconds on a CPU.",
    "Which pictures to make, one each (the batch), by class: 0 sky, 1 pagoda, 2 trees, 3 lake, 4 flower heart, "
    "5 whole flower, 6 leaves, 7 bud. E.g. \"01234567\" or \"111\".",
    photos_model, photos_model.PhotosVAE, "Flux", "image", "An empty latent, one per class.",
    "The model's fixed lossy decoder, for VAE Decode (96x96 images) or Auto Calibrate's vae input.")


DEMO_NODES = [DigitsModel, DigitsDecode, VideoModel, PhotosModel]
