"""The adapter: maps ComfyUI's official sampling hooks onto an :class:`InterceptorChain`.

The only package besides ``nodes/`` that imports ComfyUI. Its modules: ``install`` (the wrappers and the run
each sampling run gets), ``cards`` (model cards from the loaded model, the signal probes), ``conflicts`` (what
else on the model or in the run makes caching unsafe), ``blocks`` (the block-slot replacements), ``keys`` (what
the pack puts into ComfyUI's options) and ``raylight`` (what runs inside Raylight's actors).

Everything it changes goes through ComfyUI's public extension points, and the model's own code computes every
forward and every block that runs.
A few things read what ComfyUI does not offer as an interface, each checked where it is read:

* TeaCache's signal is computed from the first block's modulation modules (``cards.SIGNAL_PROBES``), which
  a ComfyUI update or another model class may rename; they are probed when the chain is installed, and a
  model without them is refused before anything is sampled;
* the model card comes from class names (``model.model``, its config, its diffusion model and which of
  its methods run the blocks: :func:`model_card`); an unknown class gets whole-model caching only;
* the Guidance Cache works with the standard guider only, told by ``CFGGuider.predict_noise`` being the
  guider's own (:func:`conflicts.check_guider`);
* other caches are told by their wrapper keys (EasyCache, LazyCache) or the key their state sits under in
  ``transformer_options`` (Kandinsky 6's MagCache), and a compiled model by the key
  ``comfy_api``'s TorchCompileModel uses (:func:`conflicts.other_cache`, :func:`conflicts.compiled`);
* a context window's frames (``transformer_options["context_window"].index_list``), the sampler's
  function name (:func:`install.sampler_identity`) and Wan CausalAR's KV-cache state
  (``conflicts.AR_STATE_KEY``).
The hooks:

* ``OUTER_SAMPLE`` wrapper: creates a fresh :class:`LoopState` for every sampling run and drops it
  afterwards (``guider.model_options`` is already a per-run copy, restored by ComfyUI when the run
  ends);
* ``PREDICT_NOISE`` wrapper: one sampler evaluation (all CFG branches of a step) per call;
* ``CALC_COND_BATCH`` wrapper (Guidance Cache only): the guider's conds list of one evaluation, of which it
  may compute the positive entries only;
* ``APPLY_MODEL`` wrapper: one batched forward, whole-model caching (fires for every model family,
  SD3 included);
* ``patches_replace["dit"]`` block replacements: block-level caching. A replacement someone else
  registered earlier is chained to, never overwritten; a forward in which another patch replaced the pack's
  block slots for that one call (Skip Layer Guidance's extra pass) is computed in full and never cached, and
  a run in which that happened to every forward says so in a note.

Under ComfyUI's native multi-GPU path (``model_options["multigpu_clones"]``, set by its MultiGPU CFG Split node)
the conds of one evaluation run on several devices at once, each from a thread of its own, and every thread
reaches these wrappers and block replacements with the same run state. A chain whose deciders decide from the
schedule decides each evaluation on the sampler's thread first and the threads share it; one whose measures the
threads can join (every measuring decider of the pack) is decided by the evaluation's threads together, told how
many there are by the conds batching wrapper (:func:`conflicts.share_decisions`, :func:`conflicts.expect_threads`,
``interceptors/threads.py``); any other run is switched off at its first evaluation with a note, and every hook
hands its work straight to the model (:func:`conflicts.native_multigpu`).

A chain is refused, before anything is sampled, where it could not be right: on a model that ComfyUI's
EasyCache/LazyCache already caches, and, for interceptors that work inside the transformer blocks, on a
model compiled whole by TorchCompileModel after the chain was installed (whose compile wrapper drops the guards
on transformer_options, so the compiled blocks would ignore or freeze the per-step decisions). A model compiled
before is compiled block by block on the pack's clone instead (:mod:`.compiled_blocks`). Both are checked when
the chain is installed and again when each run starts, since either patch can be applied after Apply
Interceptors.
"""
from __future__ import annotations

from ..interceptors.state import schedule_of  # noqa: F401  (the sampling nodes place their runs with it)
from .cards import diffusion_facts, loaded_file_name, model_card  # noqa: F401
from .conflicts import compiled, conflicts_of, native_multigpu, other_cache  # noqa: F401
from .install import guider_cfg, install, sampler_identity, uninstall  # noqa: F401
from .keys import CHAIN_KEY, STATE_KEY, WRAPPER_KEY, installed_chain  # noqa: F401
