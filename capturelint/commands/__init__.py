"""The commands of ``capturelint``, loaded when they are used.

``COMMANDS`` names each command's module and the one-line summary that
``capturelint -h`` lists (a test keeps each summary equal to its command's help), so
that listing them, ``--version`` and ``rules`` import neither torch nor the engine.
``torch`` marks the commands that run torch: the CLI sets torch's thread count
(``CAPTURELINT_THREADS``) before they run, and only then.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class CommandEntry:
    module: str
    attribute: str
    summary: str
    torch: bool = True


COMMANDS: dict[str, CommandEntry] = {
    "check": CommandEntry("capturelint.commands.check", "check",
                          "Check that CUDA-graph replay computes what eager execution computes: of the project's own "
                          "targets when its pyproject.toml names them ([tool.capturelint] targets), else of the bundled "
                          "engine (--engine), under each runner and CUDA-graph mode."),
    "diff": CommandEntry("capturelint.commands.regions", "diff",
                         "Compare two region recordings: ops that moved between captured and eager segments (by "
                         "scope and op, with counts), segments added or removed, and the change in eager ops per step."),
    "engine": CommandEntry("capturelint.engine.cli", "engine_group",
                           "Run the bundled miniature DeepSeek V4 serving engine."),
    "invariants": CommandEntry("capturelint.commands.invariants", "invariants",
                               "List the declared region invariants in force (bundled defaults, settings file, "
                               "--invariants FILE) and where each comes from; --explain ID shows the graph query it "
                               "runs and the ops it selects under each runner and mode."),
    "merge": CommandEntry("capturelint.commands.merge", "merge",
                          "Join the reports of the shards of one check (check --shard K/N, JSON or SARIF) into the "
                          "report one unsharded check would have written.", torch=False),
    "rules": CommandEntry("capturelint.commands.rules", "rules",
                          "List the rules, or print the doc of rule CODE (e.g. CL101).", torch=False),
    "run": CommandEntry("capturelint.commands.run", "run",
                        "Run a Python script as written for a GPU (python SCRIPT.py ARGS...) under the emulated CUDA "
                        "device, and check every CUDA graph it captures and replays."),
    "show": CommandEntry("capturelint.commands.regions", "show",
                         "Show the regions of each runner and mode: captured segments and eager breaks in execution "
                         "order, layer by layer, the module scopes in each with their op counts, and the findings in "
                         "red (code, op, source line) where they occur."),
    "suggest": CommandEntry("capturelint.commands.suggest", "suggest",
                            "Find the smallest eager region that makes replay equal eager: try the functions on the "
                            "capture-time stack of each finding as eager breaks, verify each with the full check, and "
                            "rank the clean ones by eager ops per step."),
    "snapshot": CommandEntry("capturelint.commands.regions", "snapshot",
                             "Record the region map of every runner and mode (default: runners v1 and v2, all four "
                             "modes; a project's targets: each target, keyed by its spec, runner and mode) as a stable, "
                             "reviewable JSON file: per graph, its segments in order (captured or eager break) and per "
                             "module scope the count of each op."),
}
