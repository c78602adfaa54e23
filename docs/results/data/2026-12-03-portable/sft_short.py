import hashlib, sys, time, torch
from trace_rl.lm.models import create_tiny_model
from trace_rl.envs.calculator import DEMO_MIX, make_tasks
from trace_rl.train.sft import train_sft, SFTParams
from trace_rl.seeding import derive_seed
torch.set_num_threads(int(sys.argv[2]))
model, tok = create_tiny_model(seed=0)
tasks = make_tasks(SFTParams().tasks, seed=derive_seed(0, "sft-demos"), **DEMO_MIX)
t = time.time()
st = train_sft(model, tok, tasks, max_steps=int(sys.argv[1]), seed=0, log_every=0)
h = hashlib.sha256()
for k, v in sorted(model.state_dict().items()):
    h.update(k.encode()); h.update(v.detach().numpy().tobytes())
print(torch.backends.cpu.get_cpu_capability(), "threads", sys.argv[2], f"{time.time()-t:.1f}s", h.hexdigest()[:16])
