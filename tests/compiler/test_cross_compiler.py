"""A profile whose cross compiler is not installed: tune and build say which compiler is
missing and how to install it, before anything is compiled."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from edgetune.compiler.target import missing_cross_compiler
from edgetune.inventory import load_profile

REPO = Path(__file__).resolve().parents[2]


def test_a_missing_cross_compiler_is_named_with_its_package(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    problem = missing_cross_compiler(load_profile(REPO / "device_profiles/rpi4.yaml"))
    assert problem is not None
    assert "rpi4.yaml: cross_compiler: 'aarch64-linux-gnu-gcc' is not installed on this host" in problem
    assert "apt-get install gcc-aarch64-linux-gnu libc6-dev-arm64-cross, or `make arm-packages`" in problem


def test_an_unknown_compiler_gets_no_guessed_package():
    profile = dataclasses.replace(load_profile(REPO / "device_profiles/rpi4.yaml"), cross_compiler="riscv-gcc-none")
    problem = missing_cross_compiler(profile)
    assert problem is not None and "'riscv-gcc-none' is not installed" in problem and "apt-get" not in problem


def test_the_host_compiler_needs_nothing_more():
    assert missing_cross_compiler(load_profile(REPO / "device_profiles/x86-avx512.yaml")) is None
