#!/usr/bin/env bash
# modak as one CI pipeline step: run `modak plan|render|build|check --json` on a job, keep its JSON, and
# publish a few values of it as step outputs. The GitHub Action (action.yml) and the GitLab template
# (integrations/gitlab/modak.gitlab-ci.yml) both call this script; any other CI can too.
#
# Inputs (environment):
#   MODAK_JOB          job spec (YAML), required
#   MODAK_COMMAND      plan (default) | render | build | check
#   MODAK_TARGET       target spec (YAML); default: the job's `target:`
#   MODAK_ENGINE       build only: docker | podman | apptainer; default: the target's container.engine
#   MODAK_PUSH         build only: true to push to the target's registry (default false)
#   MODAK_OUTPUT_DIR   render/build output folder (default modak-out)
#   MODAK_JSON_FILE    where modak's JSON goes (default modak-COMMAND.json)
#   MODAK_EXTRA_ARGS   more arguments, split like a shell would (e.g. "--baseline base.json" for check)
#   MODAK_BIN          the modak command (default: modak)
#   GITHUB_OUTPUT      (set by GitHub) step outputs are appended here as key=value lines
#   MODAK_DOTENV       (GitLab) also write the outputs as MODAK_KEY=value lines (an artifacts:reports:dotenv):
#                      MODAK_CHOICE, MODAK_IMAGE, MODAK_PREDICTED_STEP_SECONDS, ...; output-dir and json-file
#                      become MODAK_RESULT_DIR and MODAK_RESULT_JSON
#   GITHUB_STEP_SUMMARY (set by GitHub) a markdown summary line is appended here
# Outputs: choice, runtime, parameters (JSON), predicted-step-seconds, image, image-digest, output-dir, files
# (JSON list), json-file, verdict (check), exit-code, error (modak's last stderr line when it failed).
# Exit status: modak's (0 ok, 2 bad input, 4 engine unavailable, 5 build failed, 6 smoke test failed,
# 8 push failed, 9 regression; docs/reference/limits.md).
set -euo pipefail

command=${MODAK_COMMAND:-plan}
job=${MODAK_JOB:-}
out_dir=${MODAK_OUTPUT_DIR:-modak-out}
json_file=${MODAK_JSON_FILE:-modak-$command.json}
modak=${MODAK_BIN:-modak}
python=${MODAK_PYTHON:-python3}

die() { printf 'modak-step: %s\n' "$*" >&2; exit 2; }

[ -n "$job" ] || die "MODAK_JOB (the action's 'job' input) is required"
case "$command" in plan|render|build|check) ;; *) die "command must be plan, render, build or check, not '$command'" ;; esac
case "${MODAK_PUSH:-false}" in true|false|"") ;; *) die "push must be true or false, not '${MODAK_PUSH}'" ;; esac

# MODAK_EXTRA_ARGS split into words the way a shell would, without evaluating anything.
extra=()
if [ -n "${MODAK_EXTRA_ARGS:-}" ]; then
  mapfile -d '' extra < <("$python" -c 'import shlex, sys
for word in shlex.split(sys.argv[1]):
    sys.stdout.write(word + "\0")' "$MODAK_EXTRA_ARGS") || die "cannot split extra-args: ${MODAK_EXTRA_ARGS}"
fi

argv=("$modak" "$command" "$job" --json)
[ -n "${MODAK_TARGET:-}" ] && argv+=(--target "$MODAK_TARGET")
case "$command" in
  render) argv+=(-o "$out_dir") ;;
  build)
    argv+=(-o "$out_dir")
    [ -n "${MODAK_ENGINE:-}" ] && argv+=(--engine "$MODAK_ENGINE")
    [ "${MODAK_PUSH:-false}" = true ] && argv+=(--push)
    ;;
esac
argv+=("${extra[@]}")

mkdir -p "$(dirname "$json_file")"
errors=$(mktemp)
trap 'rm -f "$errors"' EXIT
printf 'modak-step: %s\n' "${argv[*]}" >&2
# stdout (the JSON) goes to the file; stderr is shown live (build progress) and kept for the error output.
set +e
{ "${argv[@]}" 2>&1 1>&3 3>&- | tee "$errors" >&2; status=${PIPESTATUS[0]}; } 3>"$json_file"
set -e

outputs=$("$python" - "$command" "$json_file" "$out_dir" "$status" "$errors" <<'PY'
import json, os, sys
from pathlib import Path

command, json_file, out_dir, status, errors = sys.argv[1:6]
out = {"exit-code": status, "json-file": json_file}
lines = [l.strip() for l in Path(errors).read_text(errors="replace").splitlines() if l.strip()]
error = next((l for l in reversed(lines) if l.startswith("modak")), lines[-1] if lines else "")
if status != "0" and error:
    out["error"] = error
try:
    data = json.loads(Path(json_file).read_text())
except (OSError, ValueError):
    data = None


def from_plan(plan):
    choice = next(c for c in plan["candidates"] if c["name"] == plan["choice"])
    return {"choice": choice["name"], "runtime": choice["runtime"],
            "parameters": json.dumps(choice["parameters"], sort_keys=True),
            "predicted-step-seconds": repr(choice["step_seconds"])}


if isinstance(data, (dict, list)):
    if command == "plan":
        out.update(from_plan(data))
    elif command == "render":
        out.update(from_plan(json.loads((Path(data["output"]) / "plan.json").read_text())))
        out["output-dir"] = os.path.abspath(data["output"])
        out["files"] = json.dumps(data["files"])
        image = data.get("image")  # not in render --json (schema_version 1) today
        if image:
            out["image"] = image.get("ref") or "" if isinstance(image, dict) else str(image)
    elif command == "build":
        choice = data["choice"]
        out.update({"choice": choice["candidate"], "runtime": choice["runtime"],
                    "parameters": json.dumps(choice["parameters"], sort_keys=True),
                    "predicted-step-seconds": repr(data["predicted_step_seconds"]),
                    "image": data["image"]["ref"], "output-dir": data["output"],
                    "files": json.dumps(data["artifacts"])})
        pushed = data.get("pushed") or {}
        out["image-digest"] = pushed.get("digest") or data["image"].get("id") or ""
    elif command == "check":
        current = data["current"]
        out.update({"verdict": data["verdict"], "choice": current["choice"], "runtime": current["runtime"],
                    "parameters": json.dumps(current["parameters"], sort_keys=True),
                    "predicted-step-seconds": repr(current["predicted_step_seconds"])})
        if current.get("measured_step_seconds") is not None:
            out["measured-step-seconds"] = repr(current["measured_step_seconds"])
        out["message"] = data["message"]
for key, value in out.items():
    print(f"{key}={' '.join(str(value).splitlines())}")
PY
) || { echo "modak-step: could not read modak's JSON in $json_file" >&2; [ "$status" = 0 ] && status=1; }

if [ -n "${GITHUB_OUTPUT:-}" ]; then
  printf '%s\n' "$outputs" >> "$GITHUB_OUTPUT"
fi
if [ -n "${MODAK_DOTENV:-}" ]; then
  # GitLab dotenv: MODAK_CHOICE=..., MODAK_PREDICTED_STEP_SECONDS=...
  while IFS= read -r line; do
    [ -n "$line" ] || continue
    key=${line%%=*}
    case "$key" in  # not MODAK_OUTPUT_DIR / MODAK_JSON_FILE: those are this script's inputs
      output-dir) key=result-dir ;;
      json-file) key=result-json ;;
    esac
    key=${key//-/_}
    printf 'MODAK_%s=%s\n' "${key^^}" "${line#*=}"
  done <<<"$outputs" > "$MODAK_DOTENV"
fi
printf '%s\n' "$outputs" | sed 's/^/modak-step: /' >&2
if [ -n "${GITHUB_STEP_SUMMARY:-}" ]; then
  summary=$(printf '%s\n' "$outputs" | sed -n 's/^\(choice\|predicted-step-seconds\|image\|verdict\|error\)=\(.*\)$/- **\1**: `\2`/p')
  printf '### modak %s %s (exit %s)\n%s\n' "$command" "$job" "$status" "$summary" >> "$GITHUB_STEP_SUMMARY"
fi
exit "$status"
