#!/usr/bin/env bash
# Machine set-up for the tests: the one place where system packages and services the suite needs are installed.
# `make test` runs it first; run it yourself with `sudo .ci/setup-machine.sh`. Idempotent: every step checks first,
# so on a machine already set up it only looks (well under a second). Append your step at the end, in the same shape:
# check, install as root through `apt_install`, or say what to do.
#
# Without root nothing is installed. A missing bubblewrap then stops here with the command that installs it, unless
# MOLT_SKIP_ISOLATION=1 (the sandbox tests then skip, and pytest's summary line counts them).
set -euo pipefail

have() { command -v "$1" >/dev/null 2>&1; }
is_root() { [ "$(id -u)" = 0 ]; }
updated=""
apt_install() { # apt_install PACKAGE...: as root on Debian/Ubuntu; `apt-get update` once, only when installing
  is_root && have apt-get || return 1
  export DEBIAN_FRONTEND=noninteractive
  if [ -z "$updated" ]; then
    apt-get update -qq
    updated=1
  fi
  echo "setup-machine: apt-get install $*"
  apt-get install -y -qq "$@" >/dev/null
}
skip_isolation() { [ "${MOLT_SKIP_ISOLATION:-}" = 1 ]; }

# --- bubblewrap: the local sandbox's jails ---
if ! have bwrap; then
  if ! apt_install bubblewrap; then
    if skip_isolation; then
      echo "setup-machine: WARNING: no bubblewrap; MOLT_SKIP_ISOLATION=1, so the sandbox tests will be SKIPPED" >&2
    else
      cat >&2 <<'EOF'
setup-machine: bubblewrap is missing, and the sandbox tests need it (a skipped sandbox test is not a pass).
  install it as root:   sudo apt-get install bubblewrap     (Debian/Ubuntu; or: sudo .ci/setup-machine.sh)
                        sudo dnf install bubblewrap         (Fedora/RHEL)
  or run without the sandbox tests, which then count as skipped:   MOLT_SKIP_ISOLATION=1 make test
EOF
      exit 1
    fi
  fi
fi

# --- a Docker engine: the docker sandbox provider (installed and started where that is possible) ---
if ! docker info >/dev/null 2>&1; then
  if is_root && ! have dockerd; then
    apt_install docker.io || echo "setup-machine: docker.io could not be installed; the docker sandbox tests will skip" >&2
  fi
  if is_root && have dockerd; then
    # no bridge or iptables: works in containers without NET_ADMIN; the sandbox's containers have no network anyway.
    # Started detached (it outlives this script: the tests need it), once; its log is /var/log/molt-dockerd.log.
    echo "setup-machine: starting dockerd"
    setsid nohup dockerd --bridge=none --iptables=false --ip6tables=false --ip-masq=false \
      >/var/log/molt-dockerd.log 2>&1 </dev/null &
    for _ in $(seq 30); do docker info >/dev/null 2>&1 && break; sleep 1; done
    docker info >/dev/null 2>&1 || echo "setup-machine: dockerd did not start (see /var/log/molt-dockerd.log)" >&2
  elif ! skip_isolation; then
    echo "setup-machine: no Docker engine answers; the docker sandbox tests will skip (install one as root)" >&2
  fi
fi

# --- PostgreSQL and Chromium: the registry's tests run against a throwaway PostgreSQL cluster and drive the hub's
# pages in headless Chromium ---
if ! compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null && ! have initdb; then
  apt_install postgresql || echo "setup-machine: PostgreSQL is missing and could not be installed (as root: apt-get install postgresql)" >&2
fi
if [ ! -x /usr/bin/chromium ]; then
  apt_install chromium || echo "setup-machine: Chromium is missing and could not be installed (as root: apt-get install chromium)" >&2
fi

# --- iproute2: the multi-node Ray test joins two network namespaces with a veth pair (`ip netns`) ---
if ! have ip; then
  apt_install iproute2 || echo "setup-machine: ip (iproute2) is missing and could not be installed; the multi-node test will fail" >&2
fi
