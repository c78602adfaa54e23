import hashlib, sys
from safetensors.torch import load_file
from safetensors import safe_open
p = sys.argv[1]
sd = load_file(p)
h = hashlib.sha256()
for k, v in sorted(sd.items()):
    h.update(k.encode()); h.update(v.detach().numpy().tobytes())
with safe_open(p, "pt") as f: print("metadata", f.metadata())
print(sorted(sd)[:3], len(sd), "tensors digest", h.hexdigest()[:16])
