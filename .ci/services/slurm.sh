# Sourced by .ci/run: install Slurm 22.05 and munge from Debian when they are missing, quietly. Nothing else:
# the session fixture in tests/scaleout/conftest.py writes its own slurm.conf, starts munged, slurmctld and
# two slurmd in a temporary directory and stops them when the session ends. Without Slurm those tests skip.
if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v sbatch >/dev/null \
    || ! command -v munged >/dev/null; then
  if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        slurmctld slurmd slurm-client munge; } >/dev/null 2>&1 \
      || echo "slurm.sh: installing Slurm failed; the Slurm tests will skip" >&2
  else
    echo "slurm.sh: Slurm is not installed and apt-get as root is not available; the Slurm tests will skip" >&2
  fi
fi
