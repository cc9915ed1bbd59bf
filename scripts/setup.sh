#!/usr/bin/env bash
# Installs what repronet's demo and tests need on a fresh Debian machine
# (as root): containerd and runc (the sandbox), busybox-static (the sample
# agents), iproute2, e2fsprogs and nftables (disk quotas, egress rules),
# debootstrap (the sandbox's Debian test image and the HAL adapter's image),
# python3-aiofiles and python3-tqdm (HAL's upload check), python3-numpy (HeurekaBench's published grader), chromium (the dashboard's browser tests drive it
# headless). Go 1.26 must be on the machine (/usr/local/go).
# Idempotent: does nothing when everything is present.
set -euo pipefail

need=()
command -v containerd >/dev/null 2>&1 || need+=(containerd)
command -v runc >/dev/null 2>&1 || need+=(runc)
[ -x /bin/busybox ] || need+=(busybox-static)
command -v ip >/dev/null 2>&1 || need+=(iproute2)
[ -x /usr/sbin/mkfs.ext4 ] || need+=(e2fsprogs)   # per-attempt disk quota filesystems
[ -x /usr/sbin/nft ] || need+=(nftables)          # egress allow-lists
[ -x /usr/sbin/iptables ] || need+=(iptables)     # the NAT test's firewall rule
[ -x /usr/sbin/debootstrap ] || need+=(debootstrap) # the sandbox's Debian test image (apt, pip)
command -v dpkg-deb >/dev/null 2>&1 || need+=(dpkg)  # the package tests' .deb files
command -v systemd-analyze >/dev/null 2>&1 || need+=(systemd)  # dist's test verifies the units
command -v chromium >/dev/null 2>&1 || need+=(chromium)  # the dashboard's browser tests
command -v npm >/dev/null 2>&1 || need+=(npm)  # the CLI agents' npm tarballs (make fixtures: npm pack)
# HAL's own upload check (scripts/hal_upload_check.py) imports these, with Debian's python3
/usr/bin/python3 -c 'import aiofiles, tqdm' >/dev/null 2>&1 || need+=(python3-aiofiles python3-tqdm)
# HeurekaBench's published evaluate_agent_answer.py, run by bench/heureka's comparison test, uses numpy
/usr/bin/python3 -c 'import numpy' >/dev/null 2>&1 || need+=(python3-numpy)

if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "setup: need root to install: ${need[*]}" >&2
    exit 1
  fi
  echo "setup: installing ${need[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${need[@]}" >/dev/null
fi

if ! command -v go >/dev/null 2>&1 && [ ! -x /usr/local/go/bin/go ]; then
  echo "setup: Go 1.26 is required (expected at /usr/local/go/bin/go)" >&2
  exit 1
fi
