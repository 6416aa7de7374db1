"""Regenerate the ``ifx-*`` rows of cases.toml from a SemiAnalysisAI/InferenceX checkout (dev tool, not a test).

    python tests/field/mine_inferencex.py /path/to/InferenceX > /tmp/ifx_cases.toml

Reads configs/amd-master.yaml and configs/deprecated/amd-*.yaml at HEAD (single-node recipes: model, runner, framework,
image, every tp/ep of the search space) and each recipe's launch script for the MoE switches it sets
(VLLM_ROCM_USE_AITER[_MOE], --moe-backend, SGLANG_USE_AITER, AITER_* MoE variables). Needs PyYAML.
"""
import collections
import re
import subprocess
import sys

import yaml

REPO = sys.argv[1]
SHA = subprocess.check_output(["git", "-C", REPO, "rev-parse", "HEAD"]).decode().strip()
def show(p): return subprocess.check_output(["git", "-C", REPO, "show", f"HEAD:{p}"]).decode()
files = ["configs/amd-master.yaml"] + [f for f in subprocess.check_output(["git", "-C", REPO, "ls-tree", "-r", "--name-only", "HEAD", "configs/deprecated"]).decode().split() if "amd" in f]
scripts = [s for s in subprocess.check_output(["git", "-C", REPO, "ls-tree", "-r", "--name-only", "HEAD", "benchmarks/single_node"]).decode().split() if re.search(r"mi3[0-9]+x", s)]
MODEL = {
 "amd/DeepSeek-R1-0528-MXFP4-Preview": "dsr1-mxfp4", "amd/DeepSeek-R1-0528-MXFP4": "dsr1-mxfp4", "amd/DeepSeek-R1-0528-MXFP4-v2": "dsr1-mxfp4",
 "deepseek-ai/DeepSeek-R1-0528": "dsr1-fp8", "deepseek-ai/DeepSeek-V4-Pro": None,
 "Qwen/Qwen3.5-397B-A17B-FP8": "qwen3.5-fp8", "amd/Qwen3.5-397B-A17B-MXFP4": "qwen3.5-mxfp4", "Qwen/Qwen3.5-397B-A17B": "qwen3.5-bf16",
 "moonshotai/Kimi-K3": "kimi-k3-mxfp4", "moonshotai/Kimi-K2.5": "kimi-k2.5-int4", "amd/Kimi-K2.5-MXFP4": "kimi-k2.5-mxfp4",
 "zai-org/GLM-5-FP8": "glm5-fp8", "amd/GLM-5.1-MXFP4": "glm5-mxfp4", "amd/GLM-5.2-MXFP4": "glm5-mxfp4", "zai-org/GLM-5.2-FP8": "glm5-fp8",
 "MiniMaxAI/MiniMax-M2.5": "minimax-m2.5-fp8", "amd/MiniMax-M2.5-MXFP4": "minimax-m2.5-mxfp4",
 "MiniMaxAI/MiniMax-M3-MXFP8": "minimax-m3-mxfp8", "amd/MiniMax-M3-MXFP4": "minimax-m3-mxfp4", "openai/gpt-oss-120b": "gpt-oss-120b",
}
PRODUCT = {"mi300x": "MI300X", "mi325x": "MI325X", "mi355x": "MI355X"}
def script_for(key, framework):
    # configs key -> launch script name (prefix_precision_runner[_framework][_mtp])
    m = re.match(r"([a-z0-9.]+)-([a-z0-9]+)-(mi3\d\dx)-(\w+?)(-agentic)?(-mtp)?$", key)
    if not m: return None
    prefix, prec, runner, fw, agentic, mtp = m.groups()
    cands = []
    base = f"{prefix}_{prec}_{runner}"
    for fwpart in ([f"_{fw}"] if fw not in ("sglang",) else ["", "_sglang"]) + ([""] if fw == "vllm" else []):
        name = base + fwpart + ("_mtp" if (mtp or agentic) else "")
        cands.append(name)
    for s in scripts:
        n = s.rsplit("/", 1)[1][:-3]
        if (("agentic" in s) == bool(agentic)) and n in cands:
            return s
    return None
FLAGS = re.compile(r"VLLM_ROCM_USE_AITER(?:_MOE)?=[0-9]|SGLANG_USE_AITER=[0-9]|--moe-backend[ =][a-z_0-9]+|--moe-runner-backend[ =][a-z_0-9]+|AITER_BF16_FP8_MOE_BOUND=[0-9]+|ATOM_USE_TRITON_MOE=[0-9]|--quantization[ =][a-z_0-9]+|AITER_SITUV2_A8W4=[0-9]|AITER_FLYDSL_FORCE=[0-9]")
rows = {}
for f in files:
    d = yaml.safe_load(show(f))
    for key, v in d.items():
        if not isinstance(v, dict) or v.get("multinode"):
            continue
        model = MODEL.get(v["model"], "missing")
        if model == "missing":
            print("MISSING", v["model"], file=sys.stderr); continue
        runner = v["runner"].split(":")[-1].split("-")[0]
        product = PRODUCT[runner]
        fw = v["framework"]
        s = script_for(key, fw)
        flags = sorted(set(FLAGS.findall(show(s)))) if s else []
        if model is None:  # DeepSeek-V4-Pro: FP8 dequant path on gfx942, W4A8 on MI355X
            model = "dsv4-pro-fp8" if "fp8" in key else "dsv4-pro-w4a8"
        for sc in (v.get("scenarios") or {}).values():
            for sp in sc:
                for p in sp.get("search-space", []):
                    tp, ep = p.get("tp"), p.get("ep", 1)
                    k = (model, product, fw, v["image"], tp, ep)
                    rows.setdefault(k, {"keys": set(), "files": set(), "flags": flags, "script": s, "hf": v["model"]})
                    rows[k]["keys"].add(key); rows[k]["files"].add(f)
out = []
for (model, product, fw, image, tp, ep), r in sorted(rows.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2], kv[0][3], kv[0][4], kv[0][5])):
    out.append(dict(model=model, hf=r["hf"], product=product, engine=fw, release=image, tp=tp, ep=ep,
                    keys=sorted(r["keys"]), files=sorted(r["files"]), flags=r["flags"], script=r["script"]))
B = f"https://github.com/SemiAnalysisAI/InferenceX/blob/{SHA}"
def path_of(r):
    fl = set(r["flags"]); eng = r["engine"]
    if r["model"] == "minimax-m3-mxfp8" and r["product"] in ("MI300X", "MI325X"):
        return "emulation", ("gfx942 has no MX instructions, so vLLM serves the MXFP8 MoE as a BF16-emulated MoE "
                             "('per-step BF16-emulated MoE weight read', https://github.com/SemiAnalysisAI/InferenceX/pull/1951)")
    if eng == "atom": return "aiter", "ATOM serves MoE through AITER's fused_moe (no Triton MoE switch in the script)"
    if eng == "vllm":
        if "--moe-backend flydsl" in fl: return "aiter-flydsl", "--moe-backend flydsl"
        if "--moe-backend aiter" in fl: return "aiter", "--moe-backend aiter with VLLM_ROCM_USE_AITER=1"
        if "--moe-backend auto" in fl and "VLLM_ROCM_USE_AITER=1" in fl: return "aiter-any", "VLLM_ROCM_USE_AITER=1 with AITER_SITUV2_A8W4=1 (an AITER fused_moe switch)"
        if "VLLM_ROCM_USE_AITER_MOE=0" in fl: return "any", "VLLM_ROCM_USE_AITER_MOE=0: vLLM's non-AITER MoE backend"
        if "VLLM_ROCM_USE_AITER=1" in fl: return "any", "VLLM_ROCM_USE_AITER=1, MoE backend left to vLLM's oracle"
        return "any", "no MoE backend flag: vLLM's default oracle"
    if eng == "sglang":
        if "SGLANG_USE_AITER=1" in fl: return "aiter", "SGLANG_USE_AITER=1"
        if "AITER_BF16_FP8_MOE_BOUND=0" in fl: return "aiter", "AITER_BF16_FP8_MOE_BOUND=0 (an AITER fused_moe switch)"
        return "any", "no MoE backend flag: SGLang's default"
    raise ValueError(eng)
lines = []
seen = {}
for r in out:
    path, why = path_of(r)
    ident = f"ifx-{r['model']}-{r['product'].lower()}-{r['engine']}-tp{r['tp']}-ep{r['ep']}"
    n = seen.get(ident, 0); seen[ident] = n + 1
    if n: ident += f"-{n+1}"
    files = "; ".join(f"{B}/{f}" for f in r["files"])
    src = files + (f"; {B}/{r['script']}" if r["script"] else "")
    lines.append(f'''[[case]]
id = "{ident}"
model = "{r['model']}"
checkpoint = "{r['hf']}"
product = "{r['product']}"
engine = "{r['engine']}"
release = "{r['release']}"
tp = {r['tp']}
ep = {r['ep']}
outcome = "works"
path = "{path}"
reported = "InferenceX benchmark recipe {', '.join(r['keys'])} serves it at tp={r['tp']} ep={r['ep']}; MoE path: {why}"
source = "{src}"
''')
print("\n".join(lines))
