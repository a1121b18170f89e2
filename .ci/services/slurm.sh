# Sourced by .ci/run: install Slurm 22.05 and munge from Debian when missing. Nothing else: the session
# fixture in tests/scaleout/conftest.py writes its own slurm.conf, starts munged, slurmctld and slurmd in a
# temporary directory and stops them at the end of the session.
if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v sbatch >/dev/null \
    || ! command -v munged >/dev/null; then
  if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null
    apt-get install -y -qq --no-install-recommends slurmctld slurmd slurm-client munge >/dev/null
  else
    echo "slurm.sh: Slurm is not installed and apt-get (as root) is not available; Slurm tests will skip" >&2
  fi
fi
