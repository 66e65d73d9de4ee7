"""`cuda_sync` (service/engine/cuda_sync.py): the primary context's flags go to the CUDA driver before any
session; checked against a stand-in driver built here (this machine has no GPU), and a server on a machine
without a driver starts as before."""

from __future__ import annotations

import ctypes
import shutil
import subprocess

import pytest

from bertserve.client import Client
from bertserve.service.engine import cuda_sync, model_registry, runtime
from bertserve.service.settings import Settings
from tests.helpers.server import ServerThread

FAKE_DRIVER = r"""
static int init_result = 0, device_asked = -1, flags_set = -1, handle_set = -1;
int cuInit(unsigned flags) { return flags == 0 ? init_result : 1; }
int cuDeviceGet(int *handle, int ordinal) { device_asked = ordinal; *handle = 40 + ordinal; return 0; }
int cuDevicePrimaryCtxSetFlags_v2(int handle, unsigned flags) { handle_set = handle; flags_set = flags; return 0; }
void fake_fail_init(int code) { init_result = code; }
int fake_device_asked(void) { return device_asked; }
int fake_handle_set(void) { return handle_set; }
int fake_flags_set(void) { return flags_set; }
"""


@pytest.fixture
def fake_driver(tmp_path):
    if shutil.which("cc") is None:
        pytest.skip("no C compiler to build the stand-in driver")
    source = tmp_path / "fake_cuda.c"
    source.write_text(FAKE_DRIVER)
    library = tmp_path / "libfakecuda.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(library), str(source)], check=True)
    return str(library), ctypes.CDLL(str(library))


@pytest.mark.parametrize(("mode", "flags"), [("blocking", 4), ("yield", 2), ("spin", 1)])
def test_the_mode_is_set_on_the_devices_primary_context(fake_driver, mode, flags):
    path, driver = fake_driver
    assert cuda_sync.apply(mode, device=1, driver=path) is None
    assert (driver.fake_device_asked(), driver.fake_handle_set(), driver.fake_flags_set()) == (1, 41, flags)


def test_auto_leaves_cudas_own_choice(fake_driver):
    path, driver = fake_driver
    assert cuda_sync.apply("auto", driver=path) is None
    assert driver.fake_flags_set() == -1


def test_a_driver_error_or_no_driver_is_said_not_raised(fake_driver):
    path, driver = fake_driver
    driver.fake_fail_init(100)  # CUDA_ERROR_NO_DEVICE
    assert cuda_sync.apply("blocking", driver=path) == "cuInit failed (CUresult 100)"
    assert driver.fake_flags_set() == -1
    assert (
        cuda_sync.apply("blocking", driver="libno-such-driver.so.1")
        == "no CUDA driver (libno-such-driver.so.1)"
    )


def test_a_server_asked_to_block_on_a_machine_without_a_gpu_serves(tiny_repo):
    with ServerThread(model_repo=tiny_repo, models=["tiny-embed"], cuda_sync="blocking") as server:
        client = Client(server.address)
        try:
            assert len(client.embed(["a gpu-less machine"]).vectors) == 1
            assert client.info().models[0].provider == "CPUExecutionProvider"
        finally:
            client.close()


def test_the_engine_sets_it_once_before_its_first_session_and_a_front_never(monkeypatch, tiny_repo):
    events = []
    monkeypatch.setattr(cuda_sync, "apply", lambda mode, *args, **kwargs: events.append(("cuda_sync", mode)))
    cuda = [(runtime.CUDA, {}), runtime.CPU]  # as where onnxruntime has CUDA (the sessions stay on CPU)
    monkeypatch.setattr(
        cuda_sync, "providers_for", lambda provider: cuda if provider != "cpu" else [runtime.CPU]
    )
    made = runtime.ort.InferenceSession

    def session(*args, **kwargs):
        events.append(("session",))
        return made(*args, **kwargs)

    monkeypatch.setattr(runtime.ort, "InferenceSession", session)
    settings = Settings(model_repo=tiny_repo, models=["tiny-embed"], cuda_sync="blocking")
    model_registry.load(settings)
    assert events[0] == ("cuda_sync", "blocking") and events.count(events[0]) == 1 and ("session",) in events
    events.clear()
    model_registry.load(settings, front=True)  # a front of several makes no session
    model_registry.load(settings.model_copy(update={"provider": "cpu"}))
    assert ("cuda_sync", "blocking") not in events
