"""What the pack puts into ComfyUI's options: its wrapper key, the run of the sampling under way and the chain an
Apply Interceptors node installed."""
from __future__ import annotations

WRAPPER_KEY = "cached_sampler"
STATE_KEY = "cached_sampler_state"
CHAIN_KEY = "cached_sampler_chain"


def installed_chain(model):
    """The chain an Apply Interceptors node already put on this model (an InterceptorChain), if any."""
    return model.model_options.get("transformer_options", {}).get(CHAIN_KEY)
