#!/bin/bash
# numparity preflight for Slurm: `numparity-agent check` on this node's GPUs before a job
# starts (Prolog) and between jobs (HealthCheckProgram). Manual: docs/how-to/preflight.md.
#
#   install -m 755 deploy/slurm/numparity-check.sh /etc/slurm/numparity-check.sh
#   # then the lines of deploy/slurm/slurm.conf.numparity in slurm.conf; scontrol reconfigure
#
# As the Prolog (slurmd sets SLURM_JOB_ID): the job's GPUs (SLURM_JOB_GPUS) are checked.
# slurmd gives the prolog CUDA_VISIBLE_DEVICES set to the job's GPUs as well, so CUDA
# shows them as cuda:0, cuda:1, ...: the script checks the slot each of the job's GPUs has
# there (and names the GPU by Slurm's index in the drain reason).
# Go: exit 0 and the job starts. No-go (a GPU gives other bits than the lab's pinned
# answers, or cannot compute): the node is drained with the reason and the device, and
# the exit is 1, so Slurm requeues the job (a batch job is then also held, unless
# SchedulerParameters has nohold_on_prolog_fail: deploy/slurm/slurm.conf.numparity).
# As the HealthCheckProgram (no SLURM_JOB_ID): every GPU is checked; a no-go drains the
# node. slurmd ignores a health check's exit code, so it always exits 0. slurmd kills a
# health check that runs past 60 s (a fixed limit, not PrologEpilogTimeout): its budget
# is NUMPARITY_HEALTH_CHECK_SECONDS, at most 50, so the drain is made before that.
#
# When the check cannot tell (the server is unreachable or refuses the token, the
# environment is unknown, the budget ran out, the agent is missing or stops on a usage
# error) NUMPARITY_CHECK_FAIL decides: "open" (the default here: a numparity server that
# is down, or a node whose agent is not installed yet, must not drain a cluster) lets the
# job start and only a device's no-go (exit 10 or 13) drains; "closed" drains on any
# exit but 0. Each outcome is logged to syslog (`journalctl -t numparity-check`) and to
# stderr.
#
# Settings (environment, or /etc/numparity/check.env):
#   NUMPARITY_AGENT          the agent in the node's ML environment (/opt/ml/bin/numparity-agent)
#   NUMPARITY_CONFIG         the agent's config: server, token_file (/etc/numparity/agent.toml)
#   NUMPARITY_NUMERIC_ENV    the node's numeric settings (/etc/numparity/numeric.env)
#   NUMPARITY_CHECK_SECONDS  the prolog's budget, below PrologEpilogTimeout (60)
#   NUMPARITY_HEALTH_CHECK_SECONDS  the health check's budget, at most 50 (45)
#   NUMPARITY_CHECK_FAIL     open | closed (open)
#   NUMPARITY_SCONTROL       scontrol (scontrol on the PATH; an absolute path where Slurm
#                            is installed outside the standard directories)
#   SLURM_CONF               where slurm.conf is not at Slurm's default path: slurmd gives
#                            the health check no SLURM_CONF, and scontrol could not drain
set -u

# slurmd runs the prolog with no PATH at all (bash then uses a built-in one of its own,
# not exported, that ends in ".", the current directory): the standard directories, then
# a PATH the script was given, if any, never ".".
inherited=""
case $(declare -p PATH 2>/dev/null) in
    "declare -x"*) inherited=$PATH ;;
esac
PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin${inherited:+:$inherited}
PATH=${PATH//:.:/:}
PATH=${PATH%:.}
export PATH

if [ -r /etc/numparity/check.env ]; then
    set -a; . /etc/numparity/check.env; set +a
fi
AGENT=${NUMPARITY_AGENT:-/opt/ml/bin/numparity-agent}
CONFIG=${NUMPARITY_CONFIG:-/etc/numparity/agent.toml}
NUMERIC_ENV=${NUMPARITY_NUMERIC_ENV:-/etc/numparity/numeric.env}
SECONDS_BUDGET=${NUMPARITY_CHECK_SECONDS:-60}
HEALTH_SECONDS=${NUMPARITY_HEALTH_CHECK_SECONDS:-45}
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

if [ -z "${SLURM_JOB_ID:-}" ]; then
    # The health check: slurmd kills it at 60 s, before it could drain.
    if ! [[ $HEALTH_SECONDS =~ ^[0-9]+$ ]] || [ "$HEALTH_SECONDS" -gt 50 ]; then
        say "NUMPARITY_HEALTH_CHECK_SECONDS=$HEALTH_SECONDS: slurmd kills a health check at 60 s; using 50"
        HEALTH_SECONDS=50
    fi
    SECONDS_BUDGET=$HEALTH_SECONDS
fi

# Slurm and nvidia-smi number a node's GPUs in PCI bus order: CUDA numbers them alike,
# so cuda:N in a drain reason is the node's GPU N where CUDA shows every GPU.
export CUDA_DEVICE_ORDER=PCI_BUS_ID
devices=()
declare -A slurm_index=()  # the slot the agent names -> the GPU's index in Slurm
if [ -n "${SLURM_JOB_ID:-}" ] && [ -n "${SLURM_JOB_GPUS:-}" ]; then
    IFS=, read -ra job_gpus <<< "$SLURM_JOB_GPUS"
    visible=()
    if [ -n "${CUDA_VISIBLE_DEVICES+set}" ]; then
        # slurmd sets it to the job's GPUs: CUDA shows only those, the first as cuda:0.
        IFS=, read -ra visible <<< "$CUDA_VISIBLE_DEVICES"
    fi
    list=""
    for index in "${job_gpus[@]}"; do
        slot=$index  # no CUDA_VISIBLE_DEVICES: CUDA shows every GPU
        if [ -n "${CUDA_VISIBLE_DEVICES+set}" ]; then
            slot=""
            for position in "${!visible[@]}"; do
                if [ "${visible[$position]}" = "$index" ]; then slot=$position; break; fi
            done
        fi
        if [ -z "$slot" ]; then
            # CUDA_VISIBLE_DEVICES names the GPUs otherwise (UUIDs): the visible ones are
            # the job's.
            list=all
            slurm_index=()
            break
        fi
        list="${list:+$list,}cuda:$slot"
        slurm_index[cuda:$slot]=$index
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
        reason=$(grep -m1 -E 'NO-GO' <<< "$output")
        slot=${reason%% *}
        if [ -n "${slurm_index[$slot]:-}" ] && [ "${slurm_index[$slot]}" != "${slot#cuda:}" ]; then
            reason="GPU ${slurm_index[$slot]}: $reason"
        fi
        reason=$(cut -c1-200 <<< "$reason")
        ;;
    *)
        # Undetermined: a cause --fail-closed reports (5, 11, 12, 14), a usage error (2),
        # an agent that is not there (127) or cannot run (126).
        reason="check could not tell (exit $code): $(tail -n1 <<< "$output" | cut -c1-160)"
        if [ "$FAIL" = open ]; then
            say "${SLURM_JOB_ID:+job $SLURM_JOB_ID: }$reason; not drained (NUMPARITY_CHECK_FAIL=open)"
            exit 0
        fi
        ;;
esac
if ! failed=$("$SCONTROL" update NodeName="$NODE" State=DRAIN \
        Reason="numparity: ${reason:-exit $code}" 2>&1); then
    # slurmd gives a health check no SLURM_CONF: scontrol finds only the default path.
    say "could not drain $NODE: $(tail -n1 <<< "$failed" | cut -c1-160)" \
        "(slurm.conf elsewhere than Slurm's default path: SLURM_CONF in /etc/numparity/check.env)"
fi
if [ -n "${SLURM_JOB_ID:-}" ]; then
    exit 1
fi
exit 0
