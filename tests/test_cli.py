"""The `vespo` command and the kernel figure."""

import subprocess
import sys

import pytest
import torch

from vespo.cli import main
from vespo.plots import _method_curves


@pytest.mark.parametrize("positive", [True, False])
def test_figure_curves_are_consistent(positive):
    # every kernel gives on-policy samples unit weight, and each drawn surrogate satisfies f'(w) = phi(w) / w
    w = torch.tensor([0.3, 0.7, 1.1, 1.6, 2.5], dtype=torch.float64)
    h = 1e-7
    for name, curve in _method_curves(positive).items():
        assert curve(torch.ones(1, dtype=torch.float64))[0].item() == pytest.approx(1.0), name
        phi, _ = curve(w)
        fd = (curve(w + h)[1] - curve(w - h)[1]) / (2 * h)
        torch.testing.assert_close(fd, phi / w, rtol=1e-5, atol=1e-6, msg=name)


def test_kernels_command_writes_png(tmp_path):
    assert main(["kernels", "--out", str(tmp_path)]) == 0
    png = tmp_path / "kernels.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 20_000


def test_unknown_command_and_help(capsys):
    assert main(["frobnicate"]) == 2
    assert "unknown command 'frobnicate'" in capsys.readouterr().err
    assert main([]) == 0
    assert "bound" in capsys.readouterr().out


def test_console_script_runs():
    out = subprocess.run(
        [sys.executable, "-m", "vespo", "bound", "--c1", "3", "--c2", "2"], capture_output=True, text=True
    )
    assert out.returncode == 0 and "K       = 1 " in out.stdout
