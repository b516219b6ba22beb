"""Mixed-precision training with graphed callables and a ``GradScaler``, as PyTorch's
CUDA-graph and AMP documentation combine them.

    capturelint run examples/plain/amp_graphed_step.py --cached-autocast   # exit 1, CL115 (and CL101, CL104)
    capturelint run examples/plain/amp_graphed_step.py                     # exit 0

The model's forward and backward are graphed with ``make_graphed_callables`` under
``torch.autocast``; the loss is scaled by a ``GradScaler`` whose ``step`` and ``update``
run eagerly, after the graphs (``scaler.step`` reads ``found_inf`` on the host, which no
capture may do: inside a capture it is CL106). With ``--cached-autocast`` the autocast
region keeps its default cast cache: the lower-precision copies of the weights made
while capturing are cached for the region, and the graphs read copies the optimizer's
updates never reach (CL115, at the ``autocast`` line and the capture's). Here the warm-up
filled the cache, so the capture recorded no casts of the weights and reads the warm-up's
copies, which the region frees: the forward's shadow casts them afresh (CL101) and the
graph reads freed memory (CL104), both consequences CL115 names the cause of. The fix,
which PyTorch requires for captures, is ``torch.autocast(..., cache_enabled=False)``.
"""

import sys

import torch

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)).cuda()
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
scaler = torch.amp.GradScaler("cuda")
cache = "--cached-autocast" in sys.argv

x = torch.randn(8, 16, device="cuda")
with torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=cache):
    graphed = torch.cuda.make_graphed_callables(model, (x,))

for step in range(4):
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=False):
        out = graphed(torch.randn(8, 16, device="cuda"))
        loss = torch.nn.functional.mse_loss(out.float(), torch.zeros(8, 4, device="cuda"))
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    print(f"step {step}: loss {loss.item():.4f}, scale {scaler.get_scale():.0f}")
