"""What an object still holds: every tensor reachable from it (a run's state after release, a cache)."""
import torch


def tensors_in(obj, with_values=False, seen=None, path="run") -> list:
    """Paths (and with ``with_values`` the tensors) of every tensor reachable from ``obj`` through attributes and
    containers; callables (a run's percent_to_sigma holds the model's sampling object) are not followed."""
    seen = set() if seen is None else seen
    if id(obj) in seen or (callable(obj) and not isinstance(obj, torch.Tensor)) or isinstance(obj, type):
        return []
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        return [(path, obj) if with_values else path]
    if isinstance(obj, dict):
        items = [(f"{path}[{k!r}]", x) for k, v in obj.items() for x in (k, v)]
    elif isinstance(obj, (list, tuple, set, frozenset)):
        items = [(f"{path}[{i}]", v) for i, v in enumerate(obj)]
    elif hasattr(obj, "__dict__"):
        items = [(f"{path}.{k}", v) for k, v in vars(obj).items()]
    else:
        return []
    return [found for p, v in items for found in tensors_in(v, with_values, seen, p)]
