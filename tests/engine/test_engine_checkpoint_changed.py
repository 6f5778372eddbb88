"""A checkpoint rewritten or truncated in place while lmc loads it is an input error naming the
file (exit 2, one line), never "Bus error" nor weights that mix two versions of the file.

Deterministic, without timing: an LD_PRELOAD shim (compiled here with the system cc) counts the
loader's madvise(MADV_DONTNEED) calls — ckpt_release gives back each converted chunk of the
mapping with one — and on the SHIM_AT-th one changes SHIM_FILE as SHIM_MODE says before
forwarding the call: ``truncate`` (to 0 bytes: the rest of the load touches pages past the end
of the file, SIGBUS), ``rewrite`` (the same byte written back in place and a new mtime: the same
size, so only the stat after the load can tell), ``signal`` (raise SIGBUS, which is not a fault
on the checkpoint's pages). ``signal-after-load`` raises SIGBUS at the first pread, which is
model_embed reading a row once the load is over. The two ``signal`` modes check that the
handler turns only the checkpoint's faults during the load into the error.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest
from fixtures_engine import BROKEN_MODEL, assert_input_error, run_lmc
from util_safetensors import shard_checkpoint

MTIME = 1_000_000_000  # the mtime the rewrite leaves: 2001-09-09, not the copy's

SHIM = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static int released; /* madvise(MADV_DONTNEED) calls so far: lmc makes them from one thread */

static int mode_is(const char *mode) { return strcmp(getenv("SHIM_MODE"), mode) == 0; }

static void change(const char *path) {
    if (mode_is("signal")) {
        raise(SIGBUS);
        return;
    }
    int fd = open(path, O_RDWR);
    char byte;
    struct timespec times[2] = {{MTIME, 0}, {MTIME, 0}};
    if (fd < 0) abort();
    if (mode_is("truncate") && ftruncate(fd, 0) != 0) abort();
    if (mode_is("rewrite") && (pread(fd, &byte, 1, 0) != 1 || pwrite(fd, &byte, 1, 0) != 1 ||
                               futimens(fd, times) != 0))
        abort();
    close(fd);
}

int madvise(void *addr, size_t len, int advice) {
    int (*next)(void *, size_t, int) = (int (*)(void *, size_t, int))dlsym(RTLD_NEXT, "madvise");
    if (advice == MADV_DONTNEED && ++released == atoi(getenv("SHIM_AT")))
        change(getenv("SHIM_FILE"));
    return next(addr, len, advice);
}

ssize_t pread(int fd, void *buf, size_t n, off_t offset) {
    ssize_t (*next)(int, void *, size_t, off_t) =
        (ssize_t (*)(int, void *, size_t, off_t))dlsym(RTLD_NEXT, "pread");
    if (mode_is("signal-after-load")) raise(SIGBUS);
    return next(fd, buf, n, offset);
}
"""


@pytest.fixture(scope="module")
def shim(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("shim")
    (root / "shim.c").write_text(SHIM)
    subprocess.run(["cc", "-shared", "-fPIC", "-O1", f"-DMTIME={MTIME}", "-o", "shim.so",
                    "shim.c", "-ldl"], cwd=root, check=True, capture_output=True, text=True)
    return root / "shim.so"


def file_to_change(model: Path, shards: int) -> Path:
    """model.safetensors, or (split into shards) the shard with the last tensor loaded"""
    if shards == 1:
        return model / "model.safetensors"
    shard_checkpoint(model, shards)
    index = json.loads((model / "model.safetensors.index.json").read_text())
    return model / index["weight_map"]["model.layers.1.mlp.down_proj.weight"]


def run(lmc, model, prompt, wq="f32", env=None):
    return run_lmc(lmc, "generate", "--model", model, "--prompt", prompt, "--max-new", 2,
                   "--wq", wq, "--threads", 2, env=env)


def run_with_shim(lmc, shim, model, prompt, mode, target, wq="f32", at=2):
    env = {**os.environ, "LD_PRELOAD": str(shim), "SHIM_MODE": mode, "SHIM_FILE": str(target),
           "SHIM_AT": str(at)}
    return run(lmc, model, prompt, wq, env)


def tokens(proc) -> list[int]:
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)["tokens"]


# the BF16 file converted by each path of the loader: convert_f32 (f32), load_as_stored (bf16),
# convert_rows on the thread pool (q8)
@pytest.mark.parametrize(("mode", "shards", "wq"), [
    ("truncate", 1, "f32"), ("truncate", 1, "bf16"), ("truncate", 1, "q8"), ("truncate", 3, "q8"),
    ("rewrite", 1, "f32"), ("rewrite", 3, "bf16")])
def test_a_checkpoint_changed_while_loading_is_an_error_naming_it(lmc, shim, tiny_model, broken,
                                                                   prompt, mode, shards, wq):
    target = file_to_change(broken, shards)
    before = target.stat()
    # the copy (sharded or not) loads as the original does, with the shim in place too
    reference = tokens(run(lmc, tiny_model(BROKEN_MODEL), prompt, wq))
    assert tokens(run(lmc, broken, prompt, wq)) == reference
    assert tokens(run_with_shim(lmc, shim, broken, prompt, mode, target, wq, at=1000)) == reference
    assert target.stat().st_mtime_ns == before.st_mtime_ns

    proc = run_with_shim(lmc, shim, broken, prompt, mode, target, wq)
    after = target.stat()
    assert after.st_size == (0 if mode == "truncate" else before.st_size)  # the shim changed it
    if mode == "rewrite":
        assert after.st_mtime_ns == MTIME * 10**9
    assert proc.returncode != -signal.SIGBUS and "Bus error" not in proc.stderr, proc.stderr
    assert_input_error(proc, f"{target} changed while it was being read (truncated or rewritten "
                             "in place?); load it again once it is complete")


@pytest.mark.parametrize("mode", ["signal", "signal-after-load"])
def test_a_sigbus_that_is_no_fault_on_the_checkpoint_still_kills_lmc(lmc, shim, broken, prompt,
                                                                      mode):
    proc = run_with_shim(lmc, shim, broken, prompt, mode, broken / "model.safetensors")
    assert proc.returncode == -signal.SIGBUS, (proc.returncode, proc.stderr)
    assert "changed while" not in proc.stderr
