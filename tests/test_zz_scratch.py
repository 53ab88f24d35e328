import torch
from test_families import _run, METHODS

def test_scratch(comfy):
    a, ca, _ = _run(comfy, "StableAudio3")
    b, cb, _ = _run(comfy, "StableAudio3")
    print("ref twice equal", torch.equal(a, b))
    c, cc, _ = _run(comfy, "StableAudio3", "cadence", METHODS["cadence"][1])
    print("cadence1 equal", torch.equal(a, c), cc, ca, (a - c).abs().max())
