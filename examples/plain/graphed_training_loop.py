"""PyTorch's partial-network capture in training, as its CUDA-graphs documentation writes
it: three modules graphed with ``torch.cuda.make_graphed_callables`` (each one's forward
and backward become graphs), a data-dependent choice between two of them made eagerly,
and ``loss.backward()`` and ``optimizer.step()`` outside the graphs.

    capturelint run examples/plain/graphed_training_loop.py    # exit 0

Each call of a graphed module replays its forward graph, and capturelint re-runs the
module eagerly beside it (a shadow, undone after) and compares the two; each
``backward()`` replays the backward graphs, which keep no Python to re-run: the bare-graph
rules watch their memory, and the report says they were not compared with eager.
"""

from itertools import chain

import torch

N, D_in, H, D_out = 64, 32, 16, 8
torch.manual_seed(0)
module1 = torch.nn.Linear(D_in, H).cuda()
module2 = torch.nn.Linear(H, D_out).cuda()
module3 = torch.nn.Linear(H, D_out).cuda()

loss_fn = torch.nn.MSELoss()
optimizer = torch.optim.SGD(chain(module1.parameters(), module2.parameters(), module3.parameters()), lr=0.1)

# Sample inputs used for capture
# requires_grad state of sample inputs must match
# requires_grad state of real inputs each callable sees.
x = torch.randn(N, D_in, device="cuda")
h = torch.randn(N, H, device="cuda", requires_grad=True)

module1 = torch.cuda.make_graphed_callables(module1, (x,))
module2 = torch.cuda.make_graphed_callables(module2, (h,))
module3 = torch.cuda.make_graphed_callables(module3, (h,))

real_inputs = [torch.rand_like(x) for _ in range(10)]
real_targets = [torch.randn(N, D_out, device="cuda") for _ in range(10)]

for data, target in zip(real_inputs, real_targets):
    optimizer.zero_grad(set_to_none=True)

    tmp = module1(data)  # forward ops run as a graph

    if tmp.sum().item() > 0:
        tmp = module2(tmp)  # forward ops run as a graph
    else:
        tmp = module3(tmp)  # forward ops run as a graph

    loss = loss_fn(tmp, target)
    # module2's or module3's (whichever was chosen) backward ops,
    # as well as module1's backward ops, run as graphs
    loss.backward()
    optimizer.step()
    print(f"loss {loss.item():.4f}")
