import hashlib, sys, transformers
from trace_rl.lm.models import create_tiny_model
from trace_rl.envs.calculator import DEMO_MIX, make_tasks
from trace_rl.train.sft import train_sft, SFTParams
from trace_rl.seeding import derive_seed
model, tok = create_tiny_model(seed=0)
tasks = make_tasks(SFTParams().tasks, seed=derive_seed(0, "sft-demos"), **DEMO_MIX)
st = train_sft(model, tok, tasks, max_steps=1500, seed=0, log_every=0)
h = hashlib.sha256()
sd = model.state_dict()
for k, v in sorted(sd.items()):
    if k == "lm_head.weight": continue
    h.update(k.encode()); h.update(v.detach().numpy().tobytes())
print(transformers.__version__, "loss", st["loss"], "digest(no lm_head)", h.hexdigest()[:16])
model.save_pretrained(sys.argv[1])
