"""A node whose PyTorch never picks the flash SDPA backend: every Python process started
with this folder on PYTHONPATH (the agent and its children) turns it off at start, as a
site's own sitecustomize or a framework's startup code might. On a CPU, the default
attention path then runs the math backend; the agent's knobs record
cuda.flash_sdp_enabled = false (the flag covers CPU flash too)."""

import torch

torch.backends.cuda.enable_flash_sdp(False)
