"""The `shoal` Python module (pytest, run by ctest as Python.bindings).

Environment (set by CMake): PYTHONPATH holds build/python, SHOAL_BINARY the
built `shoal`, SHOAL_SOURCE_DIR the repository. Debian's /usr/bin/python3 with
python3-numpy; the ONNX and PyTorch parts use python3-torch and python3-onnx in
subprocesses (PyTorch is never imported into the process that imports shoal).
"""
import json
import os
import re
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import shoal

SHOAL = os.environ.get("SHOAL_BINARY", "")
SRC = os.environ.get("SHOAL_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
PY = "/usr/bin/python3"


def blobs(n, dim=8, seed=0):
    """Two separable Gaussian blobs: x f32 [n, dim], y int64 [n]."""
    rng = np.random.default_rng(seed)
    y = np.arange(n) % 2
    return (rng.standard_normal((n, dim)) + 2.5 * y[:, None]).astype(np.float32), y


def have_torch():
    return subprocess.run([PY, "-c", "import torch, onnx"], capture_output=True).returncode == 0


@pytest.fixture(scope="module")
def exported_mlp(tmp_path_factory):
    """Shoal's MLP written in PyTorch, exported to ONNX by tests/python/onnx_export.py."""
    if not have_torch():
        pytest.skip("python3-torch / python3-onnx missing (apt-get install python3-torch python3-onnx)")
    out = tmp_path_factory.mktemp("mlp")
    r = subprocess.run([PY, os.path.join(SRC, "tests/python/onnx_export.py"), "mlp", str(out)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return str(out / "model.onnx")


def test_tensors_share_memory_with_numpy_both_ways():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    t = shoal.Tensor(a)
    assert t.shape == (3, 4) and t.dtype == "f32"
    back = np.asarray(t)
    assert np.shares_memory(a, back)
    a[1, 2] = 99.0
    assert back[1, 2] == 99.0 and t.numpy()[1, 2] == 99.0
    # Types Shoal keeps are kept; others widen (a copy), strided views are made contiguous.
    for dt, want in [(np.uint8, "u8"), (np.int32, "i32"), (np.int64, "i64"), (np.float64, "f64"),
                     (np.float16, "f16"), (np.bool_, "bool"), (np.int16, "i64")]:
        assert shoal.Tensor(np.zeros(3, dtype=dt)).dtype == want, dt
    assert np.array_equal(np.asarray(shoal.Tensor(a.T)), a.T)
    with pytest.raises(ValueError, match="no Shoal type"):
        shoal.Tensor(np.array(["a", "b"]))


def test_trains_on_numpy_arrays_and_round_trips_weights(tmp_path):
    xtr, ytr = blobs(512)
    xte, yte = blobs(256, seed=1)
    t = shoal.Trainer("mlp", (xtr, ytr, xte, yte), epochs=2, batch=32, lr=0.05, quiet=True,
                      threads=1, out=str(tmp_path / "run"))
    hist = t.fit()
    assert [h["epoch"] for h in hist] == [1, 2]
    assert hist[-1]["test_acc"] > 0.9, hist
    assert t.rank == 0 and t.world == 1 and t.step == 2 * t.steps_per_epoch
    more = t.fit(1)  # one more epoch, as Keras counts
    assert [h["epoch"] for h in more] == [3] and len(t.history) == 3
    sd = t.state_dict()
    assert sorted(sd) == ["fc1.bias", "fc1.weight", "fc2.bias", "fc2.weight", "fc3.bias", "fc3.weight"]
    assert sd["fc1.weight"].shape == (512, 8) and sd["fc1.weight"].dtype == np.float32
    good = t.evaluate()
    assert good["samples"] == 256 and good["accuracy"] > 0.9
    # Weights out, zeroed in (the model forgets), back in (it remembers).
    path = str(tmp_path / "w.safetensors")
    shoal.save_weights(path, sd)
    t.load_state_dict({k: np.zeros_like(v) for k, v in sd.items()})
    assert t.evaluate()["accuracy"] == pytest.approx(0.5)
    t.load_state_dict(shoal.load_weights(path))
    assert t.evaluate() == good
    with pytest.raises(ValueError, match="fc1.weight"):
        t.load_state_dict({**sd, "fc1.weight": np.zeros((3, 3), np.float32)})


def test_micro_batches_accumulate_to_the_whole_batchs_weights(tmp_path):
    xtr, ytr = blobs(512)
    xte, yte = blobs(64, seed=1)
    runs = [shoal.Trainer("mlp", (xtr, ytr, xte, yte), batch=32, micro_batches=m, lr=0.05,
                          max_steps=10, deterministic=True, quiet=True, plot=False, threads=1,
                          out=str(tmp_path / f"m{m}")) for m in (1, 4)]
    for t in runs:
        t.fit()
    whole, acc = (t.state_dict() for t in runs)
    for k in whole:
        assert np.abs(whole[k] - acc[k]).max() <= 1e-5, k
    with pytest.raises(ValueError, match="--micro-batches 3 must divide --batch 32"):
        shoal.Trainer("mlp", (xtr, ytr, xte, yte), batch=32, micro_batches=3)


def test_precision_bf16_trains_or_is_refused_by_name(tmp_path):
    xtr, ytr = blobs(512)
    xte, yte = blobs(64, seed=1)
    with pytest.raises(ValueError, match="--precision 'fp8' is not f32 or bf16"):
        shoal.Trainer("mlp", (xtr, ytr, xte, yte), precision="fp8")
    try:
        t = shoal.Trainer("mlp", (xtr, ytr, xte, yte), batch=32, lr=0.05, max_steps=20,
                          quiet=True, plot=False, threads=1, precision="bf16",
                          out=str(tmp_path / "bf16"))
    except ValueError as e:  # a CPU without bf16 products: said by name, not run in f32
        assert "avx512_bf16" in str(e) and "amx_bf16" in str(e), e
        pytest.skip(str(e))
    epochs = t.fit()
    assert epochs[-1]["test_acc"] > 0.5
    assert epochs[-1]["model_flops_per_s"] > 0 and 0 < epochs[-1]["mfu"] <= 1


def test_dict_data_and_errors_carry_shoals_message(tmp_path):
    xtr, ytr = blobs(64)
    data = {"x_train": xtr, "y_train": ytr, "x_test": xtr, "y_test": ytr}
    with pytest.raises(ValueError, match=r"--model cnn takes images \[C, H, W\]; the data's samples are \[8\]"):
        shoal.Trainer("cnn", data, quiet=True, out=str(tmp_path / "a"))
    with pytest.raises(ValueError, match="label -1 at index 0"):
        shoal.Trainer("mlp", (xtr, ytr - 1, xtr, ytr), quiet=True)
    with pytest.raises(ValueError, match="data dict has no 'y_test'"):
        shoal.Trainer("mlp", {"x_train": xtr, "y_train": ytr, "x_test": xtr})
    with pytest.raises(TypeError, match="unknown option 'learning_rate'"):
        shoal.Trainer("mlp", data, learning_rate=0.1)
    with pytest.raises(TypeError, match="epochs takes an int"):
        shoal.Trainer("mlp", data, epochs=1.5)
    with pytest.raises(ValueError, match="not one of mlp, cnn, resnet"):
        shoal.Trainer("transformer", data)
    with pytest.raises(FileNotFoundError, match="no such file"):
        shoal.Trainer("mlp", str(tmp_path / "none.npz"))
    with pytest.raises(FileNotFoundError):
        shoal.onnx.load(str(tmp_path / "none.onnx"))
    # Anything array-like is data (a torch.Tensor offers __array__ and no
    # buffer; lists nest): before, "a bytes-like object is required".
    class ArrayLike:
        def __init__(self, a):
            self.a = a

        def __array__(self, dtype=None):
            return self.a

    t = shoal.Trainer("mlp", (ArrayLike(xtr), ytr.tolist(), xtr.tolist(), ArrayLike(ytr)),
                      epochs=1, batch=16, quiet=True, threads=1, out=str(tmp_path / "like"))
    assert t.fit()[-1]["epoch"] == 1
    with pytest.raises(ValueError, match="data.s x_train"):
        shoal.Trainer("mlp", ([[1.0, 2.0], [3.0]], ytr, xtr, ytr))


FORTUNES = "/usr/share/games/fortunes/fortunes"


@pytest.mark.skipif(not os.path.exists(FORTUNES), reason="Debian's fortunes package is not installed")
def test_gpt_on_text_takes_its_size_as_keywords(tmp_path):
    t = shoal.Trainer("gpt", "text:" + FORTUNES, layers=1, heads=2, dim=16, context=8, batch=16,
                      optimizer="adam", lr=0.01, max_steps=40, quiet=True, plot=False,
                      out=str(tmp_path / "gpt"))
    m = t.fit()
    # A model that knows nothing scores ln(vocabulary) = ln(80) = 4.38 nats per character.
    assert m[-1]["test_loss"] < 3.6, m
    assert sorted(k for k in t.state_dict() if k.startswith("h.0.attn."))[:2] == [
        "h.0.attn.k.bias", "h.0.attn.k.weight"]
    with pytest.raises(ValueError, match="--dim 15 must be a positive multiple of --heads 2"):
        shoal.Trainer("gpt", "text:" + FORTUNES, heads=2, dim=15)


def test_training_releases_the_gil(tmp_path):
    xtr, ytr = blobs(8192, dim=256)
    # 12 epochs: 3 took 0.19 s on a fast host, under the 0.2 s the check needs.
    t = shoal.Trainer("mlp", (xtr, ytr, xtr[:256], ytr[:256]), epochs=12, batch=32, quiet=True,
                      threads=1, checkpoints=False, plot=False, out=str(tmp_path / "run"))
    ticks = 0
    done = threading.Event()

    def count():
        nonlocal ticks
        while not done.is_set():
            ticks += 1
            time.sleep(0.001)

    th = threading.Thread(target=count)
    th.start()
    t0 = time.time()
    t.fit()
    secs = time.time() - t0
    done.set()
    th.join()
    # A held GIL would leave the counter near 0 while fit() runs.
    assert secs > 0.2 and ticks > secs * 200, (ticks, secs)


def test_onnx_model_trains_and_pytorch_reads_its_weights(exported_mlp, tmp_path):
    m = shoal.onnx.load(exported_mlp)
    assert m.opset == 13 and m.num_nodes > 0
    assert m.inputs[0][1][1:] == (1, 28, 28)
    t = shoal.Trainer(m, "fashion-mnist", epochs=1, batch=64, lr=0.05, optimizer="momentum",
                      limit_train=3000, limit_test=1000, quiet=True, out=str(tmp_path / "run"))
    acc = t.fit()[-1]["test_acc"]
    assert acc > 0.6
    path = str(tmp_path / "trained.safetensors")
    shoal.save_weights(path, t.state_dict())
    # PyTorch loads the weights into its own MLP (ONNX names = PyTorch names)
    # and scores the same test images; Shoal normalizes with the training
    # set's mean/std, PyTorch is given the same numbers.
    script = f"""
import json, struct, sys, gzip
import numpy as np, torch
sys.path.insert(0, {os.path.join(SRC, 'tools')!r})
from peer_train_torch import model
b = open({path!r}, 'rb').read()
n = struct.unpack('<Q', b[:8])[0]
head = json.loads(b[8:8 + n])
sd = {{k: torch.from_numpy(np.frombuffer(b[8 + n + v['data_offsets'][0]:8 + n + v['data_offsets'][1]],
                                          dtype=np.float32).reshape(v['shape']).copy())
       for k, v in head.items() if k != '__metadata__'}}
net = model('mlp')
net.load_state_dict(sd)
def idx(f):
    d = gzip.open('/usr/share/datasets/fashion-mnist/' + f).read()
    k = d[3]; dims = struct.unpack('>' + 'I' * k, d[4:4 + 4 * k])
    return np.frombuffer(d, np.uint8, offset=4 + 4 * k).reshape(dims)
xtr = idx('train-images-idx3-ubyte.gz')[:3000] / 255.0
x = idx('t10k-images-idx3-ubyte.gz')[:1000] / 255.0
y = idx('t10k-labels-idx1-ubyte.gz')[:1000]
x = (x - xtr.mean()) / xtr.std()
net.eval()
with torch.no_grad():
    p = net(torch.from_numpy(x.astype(np.float32)).reshape(-1, 1, 28, 28)).argmax(1).numpy()
print((p == y).mean())
"""
    r = subprocess.run([PY, "-c", script], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert float(r.stdout.strip()) == pytest.approx(t.evaluate()["accuracy"], abs=0.003)


DIST_SCRIPT = """
import hashlib, sys
import numpy as np
import shoal
t = shoal.Trainer("mlp", "fashion-mnist", epochs=1, batch=32, limit_train=2048, limit_test=500,
                  quiet=True, checkpoints=False, plot=False, out=sys.argv[1])
h = t.fit()
sd = t.state_dict()
digest = hashlib.sha256(b"".join(sd[k].tobytes() for k in sorted(sd))).hexdigest()[:16]
line = f"RESULT rank {t.rank} world {t.world} steps {t.step} weights {digest}"
open(f"{sys.argv[1]}.result{t.rank}", "w").write(line)
"""


def run_dist(cmd, tmp_path):
    script = tmp_path / "dist.py"
    script.write_text(DIST_SCRIPT)
    env = dict(os.environ)
    r = subprocess.run(cmd(str(script), str(tmp_path / "run")), capture_output=True, text=True,
                       env=env, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    # One file per rank (their shared output pipe may interleave lines).
    return sorted(open(os.path.join(tmp_path, f)).read() for f in os.listdir(tmp_path)
                  if f.startswith("run.result"))


def test_shoal_run_gives_each_python_process_its_rank(tmp_path):
    if not SHOAL:
        pytest.skip("SHOAL_BINARY not set (run through ctest)")
    lines = run_dist(lambda s, out: [SHOAL, "run", "-n", "2", "--", PY, s, out], tmp_path)
    assert len(lines) == 2, lines
    assert lines[0].startswith("RESULT rank 0 world 2 steps 32")
    assert lines[1].startswith("RESULT rank 1 world 2 steps 32")
    # Data parallel: both ranks end with the same weights.
    assert lines[0].split()[-1] == lines[1].split()[-1]


def test_torchrun_starts_python_ranks_too(tmp_path):
    if not have_torch():
        pytest.skip("python3-torch missing: no torchrun")
    torchrun = os.path.join(SRC, "tools/torchrun.py")
    lines = run_dist(lambda s, out: [PY, torchrun, "--nproc_per_node", "2", s, out], tmp_path)
    assert [l.split()[1:5] for l in lines] == [["rank", "0", "world", "2"], ["rank", "1", "world", "2"]]
    assert lines[0].split()[-1] == lines[1].split()[-1]


def _import_shoal(env_extra, first=""):
    """A fresh interpreter that imports `first` then shoal; libgomp prints the
    policy it took (OMP_DISPLAY_ENV) to stderr when it loads."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    env.update({"OMP_DISPLAY_ENV": "verbose"}, **env_extra)
    code = (f"{first}\nimport os, shoal\nprint('policy', os.environ.get('OMP_WAIT_POLICY'), "
            "os.environ.get('GOMP_SPINCOUNT'))")
    return subprocess.run([PY, "-c", code], env=env, capture_output=True, text=True, timeout=120)


def test_import_sets_a_short_openmp_spin_unless_a_policy_is_set():
    # Before: `import shoal` left libgomp's long default spin (the CLI alone
    # set its policy), and two threads beside a busy process ran slower than one.
    r = _import_shoal({})
    assert r.returncode == 0, r.stderr
    assert "policy None 10000" in r.stdout
    assert "GOMP_SPINCOUNT = '10000'" in r.stderr  # what libgomp itself took
    kept = _import_shoal({"OMP_WAIT_POLICY": "active"})
    assert "policy active None" in kept.stdout
    assert "OMP_WAIT_POLICY = 'ACTIVE'" in kept.stderr
    spin = _import_shoal({"GOMP_SPINCOUNT": "1000"})
    assert "policy None 1000" in spin.stdout
    assert "GOMP_SPINCOUNT = '1000'" in spin.stderr


def test_import_after_another_openmp_user_warns_that_the_policy_cannot_change():
    if subprocess.run([PY, "-c", "import torch"], capture_output=True).returncode != 0:
        pytest.skip("python3-torch missing: no other module loads libgomp first")
    r = _import_shoal({}, first="import torch")
    assert r.returncode == 0, r.stderr
    assert "policy None" in r.stdout
    assert "was loaded before shoal" in r.stderr
