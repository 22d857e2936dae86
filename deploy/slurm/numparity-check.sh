#!/bin/bash
# numparity preflight for Slurm: `numparity-agent check` on this node's GPUs before a job
# starts (Prolog) and between jobs (HealthCheckProgram). Manual: docs/how-to/preflight.md.
#
#   install -m 755 deploy/slurm/numparity-check.sh /etc/slurm/numparity-check.sh
#   # then the lines of deploy/slurm/slurm.conf.numparity in slurm.conf; scontrol reconfigure
#
# As the Prolog (slurmd sets SLURM_JOB_ID): the job's GPUs (SLURM_JOB_GPUS) are checked.
# Go: exit 0 and the job starts. No-go (a GPU gives other bits than the lab's pinned
# answers, or cannot compute): the node is drained with the reason and the device, and
# the exit is 1, so Slurm requeues the job on another node.
# As the HealthCheckProgram (no SLURM_JOB_ID): every GPU is checked; a no-go drains the
# node. slurmd ignores a health check's exit code, so it always exits 0.
#
# When the check cannot tell (the server is unreachable or refuses the token, the
# environment is unknown, the budget ran out) NUMPARITY_CHECK_FAIL decides: "open" (the
# default here: a numparity server that is down must not drain a cluster) lets the job
# start; "closed" treats it as a no-go. Each outcome is logged to syslog
# (`journalctl -t numparity-check`).
#
# Settings (environment, or /etc/numparity/check.env):
#   NUMPARITY_AGENT          the agent in the node's ML environment (/opt/ml/bin/numparity-agent)
#   NUMPARITY_CONFIG         the agent's config: server, token_file (/etc/numparity/agent.toml)
#   NUMPARITY_NUMERIC_ENV    the node's numeric settings (/etc/numparity/numeric.env)
#   NUMPARITY_CHECK_SECONDS  the check's budget, below PrologEpilogTimeout (60)
#   NUMPARITY_CHECK_FAIL     open | closed (open)
#   NUMPARITY_SCONTROL       scontrol (scontrol on the PATH)
set -u

if [ -r /etc/numparity/check.env ]; then
    set -a; . /etc/numparity/check.env; set +a
fi
AGENT=${NUMPARITY_AGENT:-/opt/ml/bin/numparity-agent}
CONFIG=${NUMPARITY_CONFIG:-/etc/numparity/agent.toml}
NUMERIC_ENV=${NUMPARITY_NUMERIC_ENV:-/etc/numparity/numeric.env}
SECONDS_BUDGET=${NUMPARITY_CHECK_SECONDS:-60}
FAIL=${NUMPARITY_CHECK_FAIL:-open}
SCONTROL=${NUMPARITY_SCONTROL:-scontrol}
NODE=${SLURMD_NODENAME:-$(hostname -s)}
case $FAIL in
    open|closed) ;;
    *) echo "numparity-check: NUMPARITY_CHECK_FAIL is open or closed, not '$FAIL'; using open" >&2
       FAIL=open ;;
esac

say() {
    logger -t numparity-check -- "$*" 2>/dev/null || true
    echo "numparity-check: $*" >&2
}

# The jobs' numeric settings: the check measures the node as the job will run.
if [ -r "$NUMERIC_ENV" ]; then
    set -a; . "$NUMERIC_ENV"; set +a
fi

devices=()
if [ -n "${SLURM_JOB_ID:-}" ] && [ -n "${SLURM_JOB_GPUS:-}" ]; then
    # SLURM_JOB_GPUS holds the GPUs' indices as the node numbers them (PCI bus order);
    # the prolog runs outside the job's cgroup, so CUDA sees every GPU: number them alike.
    export CUDA_DEVICE_ORDER=PCI_BUS_ID
    list=""
    for index in ${SLURM_JOB_GPUS//,/ }; do
        list="${list:+$list,}cuda:$index"
    done
    devices=(--device "$list")
fi

output=$("$AGENT" check --config "$CONFIG" --max-seconds "$SECONDS_BUDGET" \
    "--fail-$FAIL" "${devices[@]}" 2>&1)
code=$?
while IFS= read -r line; do
    [ -n "$line" ] && say "${SLURM_JOB_ID:+job $SLURM_JOB_ID: }$line"
done <<< "$output"

case $code in
    0)
        exit 0
        ;;
    10|13)
        # The first no-go line names the device (slot, name, UUID) and the answer.
        reason=$(grep -m1 -E 'NO-GO' <<< "$output" | cut -c1-200)
        ;;
    *)
        # Undetermined with --fail-closed (5, 11, 12, 14), or a usage error (2).
        reason="check could not tell (exit $code): $(tail -n1 <<< "$output" | cut -c1-160)"
        ;;
esac
"$SCONTROL" update NodeName="$NODE" State=DRAIN Reason="numparity: ${reason:-exit $code}" \
    || say "could not drain $NODE"
if [ -n "${SLURM_JOB_ID:-}" ]; then
    exit 1
fi
exit 0
