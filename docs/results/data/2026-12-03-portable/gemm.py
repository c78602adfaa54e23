import torch, hashlib
torch.manual_seed(0)
h = hashlib.sha256()
for (m, k, n) in [(8*300, 128, 352), (8*300, 352, 128), (8*300, 128, 128), (8*300, 128, 148), (128, 2400, 352)]:
    a = torch.randn(m, k); b = torch.randn(n, k)
    y = torch.nn.functional.linear(a, b)
    h.update(y.numpy().tobytes())
    g = a.t() @ torch.randn(m, n)  # weight-grad shape
    h.update(g.numpy().tobytes())
print(h.hexdigest()[:16])
