"""PyTorch's whole-network capture, as its CUDA-graphs documentation writes it: a training
step (forward, ``backward()``, ``optimizer.step()``) captured in ``torch.cuda.graph`` and
replayed for every batch.

It is a plain program written for a GPU; ``capturelint run`` runs it unmodified on a CPU,
with the CUDA device and its graphs emulated and autograd as the program sets it:

    capturelint run examples/plain/whole_network_training.py             # exit 0
    capturelint run examples/plain/whole_network_training.py --adam      # exit 0: Adam(capturable=True)

The warm-up runs on a side stream, ``zero_grad(set_to_none=True)`` before the capture
lets ``backward()`` allocate the ``.grad`` tensors from the graph's pool, and each replay
refills them in place, so the loop never calls ``zero_grad`` again. The learning rate is
a constant here: a scheduler that changes it needs it held in a tensor
(``training_scheduler.py``).
"""

import sys

import torch

N, D_in, H, D_out = 64, 32, 16, 8
torch.manual_seed(0)
model = torch.nn.Sequential(
    torch.nn.Linear(D_in, H), torch.nn.Dropout(p=0.2), torch.nn.Linear(H, D_out), torch.nn.Dropout(p=0.1)
).cuda()
loss_fn = torch.nn.MSELoss()
if "--adam" in sys.argv:
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01, capturable=True)
else:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

# Placeholders used for capture
static_input = torch.randn(N, D_in, device="cuda")
static_target = torch.randn(N, D_out, device="cuda")

# warmup on a side stream
s = torch.cuda.Stream()
s.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(s):
    for i in range(3):
        optimizer.zero_grad(set_to_none=True)
        y_pred = model(static_input)
        loss = loss_fn(y_pred, static_target)
        loss.backward()
        optimizer.step()
torch.cuda.current_stream().wait_stream(s)

# capture
g = torch.cuda.CUDAGraph()
# Sets grads to None before capture, so backward() will create
# .grad attributes with allocations from the graph's private pool
optimizer.zero_grad(set_to_none=True)
with torch.cuda.graph(g):
    static_y_pred = model(static_input)
    static_loss = loss_fn(static_y_pred, static_target)
    static_loss.backward()
    optimizer.step()

real_inputs = [torch.rand_like(static_input) for _ in range(10)]
real_targets = [torch.rand_like(static_target) for _ in range(10)]

for data, target in zip(real_inputs, real_targets):
    # Fills the graph's input memory with new data to compute on
    static_input.copy_(data)
    static_target.copy_(target)
    # replay() includes forward, backward, and step.
    g.replay()
    # Params have been updated. static_y_pred, static_loss, and .grad
    # attributes hold values from computing on this iteration's data.
    print(f"loss {static_loss.item():.4f}")
