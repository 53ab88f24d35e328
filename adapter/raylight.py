"""The Raylight integration (komikndr/raylight): what the Apply Interceptors (Raylight) node sends to Raylight's Ray
actors (one per GPU), and the functions that run there.

ComfyUI imports a custom node pack under its folder path, a module name no Ray worker can import. So
:func:`install_on_actors` ships :func:`install` and :func:`summary` to the actors by value
(``cloudpickle.register_pickle_by_value``) through Raylight's own ``ray_patch`` mechanism, and they bring the pack
in by path, under the same name, before anything of the pack is unpickled. This module imports only the standard
library at module level for that reason (Ray and Raylight are imported when the node runs); it needs the pack at
the same path on every machine of the Ray cluster.
"""
import importlib
import importlib.util
import os
import pickle
import sys


def pack_location() -> tuple[str, str]:
    """(the pack's folder, the package name ComfyUI imported it under): what the actors import it by."""
    adapter = __name__.rpartition(".")[0]
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__))), adapter.rpartition(".")[0]


def raylight_patchers():
    """Raylight's ``ray_patch`` and ``ray_patch_with_return`` (Raylight puts its ``src`` on sys.path)."""
    try:
        import ray
        from raylight.comfy_extra_dist.ray_patch_decorator import ray_patch, ray_patch_with_return
    except ImportError as e:
        from ..interceptors import InterceptorError
        raise InterceptorError(f"Raylight (komikndr/raylight) and Ray must be installed in this ComfyUI: {e}") from None
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the actors cannot import the pack by name
    return ray_patch, ray_patch_with_return


def install_on_actors(ray_actors, chain, **options) -> str:
    """Install ``chain`` on every actor's model, replacing any chain installed there before (an empty chain: remove
    it, install nothing); rank 0's summary."""
    ray_patch, ray_patch_with_return = raylight_patchers()
    pack_dir, package = pack_location()
    ray_patch(install)(None, ray_actors, pack_dir, package, pickle.dumps((chain, options)))
    return ray_patch_with_return(summary)(None, ray_actors, pack_dir, package)


def install(_node, model, pack_dir: str, package: str, payload: bytes):
    """What ``ray_patch`` runs on every actor (as ``patch_func(node, model, *args)``): the actor's model with the
    chain and options in ``payload`` installed, in place of any chain installed before (an actor keeps its
    model across prompts). An empty chain removes the one installed before and installs nothing: the actor's
    model runs as if no chain had ever been there. Under xDiT sequence parallelism the runs reduce their metrics
    and agree their decisions over the actor's sequence-parallel group."""
    adapter, distributed = _pack(pack_dir, package)
    chain, options = pickle.loads(payload)
    if chain.empty:
        return adapter.uninstall(model)
    sequence_ranks, _, process_group = _parallelism()
    rank_group = (lambda: distributed.group_of(process_group)) if sequence_ranks > 1 else None
    return adapter.install(adapter.uninstall(model), chain, rank_group=rank_group, **options)


def summary(_node, model, pack_dir: str, package: str) -> str:
    """What ``ray_patch_with_return`` asks rank 0 for: what now runs on the actors' model."""
    adapter, _ = _pack(pack_dir, package)
    chain = adapter.installed_chain(model)
    sequence_ranks, cfg_ranks, _ = _parallelism()
    lines = [f"Installed on {adapter.model_card(model).name}: {chain.describe() if chain else '(nothing)'}"]
    if sequence_ranks > 1:
        lines.append(f"Sequence parallel over {sequence_ranks} ranks: every change metric is reduced over them and "
                     f"every decision agreed by all of them.")
    if cfg_ranks > 1:
        lines.append(f"CFG-parallel over {cfg_ranks} ranks: each rank's blocks see one branch, so block-level "
                     f"caching stays off (noted in the log); whole-model methods work.")
    if sequence_ranks == 1 and cfg_ranks == 1:
        lines.append("No xDiT parallelism on the actors: each actor samples on its own, with its own cache.")
    return "\n".join(lines)


def _pack(pack_dir: str, package: str):
    """The pack's adapter and distributed core, imported in this process under ``package`` (ComfyUI's name for
    it in the main process, so that the shipped chain unpickles). The package's own ``__init__`` (node
    registration) is not run: the actor needs only the core and the adapter."""
    if package not in sys.modules:
        spec = importlib.util.spec_from_file_location(package, os.path.join(pack_dir, "__init__.py"),
                                                      submodule_search_locations=[pack_dir])
        sys.modules[package] = importlib.util.module_from_spec(spec)
    return (importlib.import_module(f"{package}.adapter"),
            importlib.import_module(f"{package}.interceptors.distributed"))


def _parallelism():
    """(sequence-parallel ranks, CFG-parallel ranks, the sequence-parallel group's CPU process group) from xDiT's
    state in this actor; (1, 1, None) when xDiT is absent or not initialised (each actor samples alone)."""
    try:
        from xfuser.core.distributed import (get_classifier_free_guidance_world_size,
                                             get_sequence_parallel_world_size, get_sp_group)
        return get_sequence_parallel_world_size(), get_classifier_free_guidance_world_size(), get_sp_group().cpu_group
    except (ImportError, AssertionError, AttributeError):
        return 1, 1, None
