"""A whole training step captured in one CUDA graph, with a learning-rate scheduler.

    capturelint run examples/plain/training_scheduler.py --float-lr       # exit 1, CL113
    capturelint run examples/plain/training_scheduler.py --zero-grad      # exit 1, CL114
    capturelint run examples/plain/training_scheduler.py                  # exit 0

The step (forward, ``backward()``, ``optimizer.step()``) is captured as PyTorch's
documentation shows and replayed per batch, and a ``StepLR`` halves the learning rate
every two steps. With ``--float-lr`` the rate is a Python float: the captured Adam step
took it as a launch argument, so every replay keeps stepping with 0.01 whatever the
scheduler says (CL113, at the captured ``optimizer.step()`` and the ``scheduler.step()``
line). The fix holds it in a tensor (``lr=torch.tensor(0.01)``, ``capturable=True``),
which the graph reads at each replay and the scheduler updates in place.

With ``--zero-grad`` the loop calls ``optimizer.zero_grad()`` before each replay, as an
eager loop does: that re-binds every ``.grad`` to ``None``, while the replays keep
writing the tensors the capture allocated, so the gradient clipping that reads ``.grad``
clips nothing (CL114, at the ``zero_grad`` line). The captured backward refills ``.grad``
in place: leave it alone between replays.
"""

import sys

import torch

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)).cuda()
loss_fn = torch.nn.MSELoss()
lr = 0.01 if "--float-lr" in sys.argv else torch.tensor(0.01, device="cuda")
optimizer = torch.optim.Adam(model.parameters(), lr=lr, capturable=True)
scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)

static_x = torch.randn(8, 16, device="cuda")
static_y = torch.randn(8, 4, device="cuda")

side = torch.cuda.Stream()
side.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(side):
    for _ in range(3):  # warm-up: the optimizer's state exists before the capture
        optimizer.zero_grad(set_to_none=True)
        loss_fn(model(static_x), static_y).backward()
        optimizer.step()
torch.cuda.current_stream().wait_stream(side)

graph = torch.cuda.CUDAGraph()
optimizer.zero_grad(set_to_none=True)
with torch.cuda.graph(graph):
    static_loss = loss_fn(model(static_x), static_y)
    static_loss.backward()
    optimizer.step()

for step in range(6):
    if "--zero-grad" in sys.argv:
        optimizer.zero_grad()
    static_x.copy_(torch.randn(8, 16, device="cuda"))
    static_y.copy_(torch.randn(8, 4, device="cuda"))
    graph.replay()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    scheduler.step()
    print(f"step {step}: loss {static_loss.item():.4f}, grad norm {float(norm):.4f}, lr {float(scheduler.get_last_lr()[0]):.5f}")
