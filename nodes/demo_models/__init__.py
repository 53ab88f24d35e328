"""The pack's bundled demo models (tiny but real ComfyUI models trained by tools/training) and their shared loader.

Nothing here imports the rest of the pack or, at import time, ComfyUI: the training scripts load this folder as a
package of its own when the pack cannot be imported.
"""
