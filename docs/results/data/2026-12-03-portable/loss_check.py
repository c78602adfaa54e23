import torch, transformers
from trace_rl.lm.models import create_tiny_model
m, tok = create_tiny_model(0)
g = torch.Generator().manual_seed(1)
ids = torch.randint(3, 148, (4, 20), generator=g)
attn = torch.ones_like(ids); attn[1, 15:] = 0; attn[3, 10:] = 0
labels = ids.clone(); labels[:, :5] = -100; labels[attn == 0] = -100
out = m(input_ids=ids, attention_mask=attn, labels=labels)
out.loss.backward()
gn = sum(float(p.grad.double().pow(2).sum()) for p in m.parameters() if p.grad is not None)
print(transformers.__version__, f"loss {out.loss.item():.10f} gradsq {gn:.10e}")
logits = out.logits.detach()
# manual loss
sl = logits[:, :-1].reshape(-1, logits.size(-1)); tl = labels[:, 1:].reshape(-1)
print("manual", f"{torch.nn.functional.cross_entropy(sl, tl, ignore_index=-100).item():.10f}")
# padded positions' logits
print("logit sum", float(logits.double().sum()), float(logits[1, 15:].double().sum()))
