import hashlib, torch, transformers
from trace_rl.lm.models import create_tiny_model
m, tok = create_tiny_model(0)
h = hashlib.sha256()
for k, v in sorted(m.state_dict().items()):
    h.update(k.encode()); h.update(v.detach().float().numpy().tobytes())
print(transformers.__version__, "init", h.hexdigest()[:16], len(m.state_dict()))
for k, v in sorted(m.state_dict().items())[:6]:
    print(k, tuple(v.shape), float(v.float().std()), float(v.float().mean()))
# forward pass
ids = torch.tensor([[5, 6, 7, 8, 9, 10]])
with torch.no_grad():
    out = m(ids).logits
print("logits", float(out.sum()), float(out.abs().max()))
