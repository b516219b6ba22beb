"""Machine-readable renderings of findings for CI systems.

``sarif.to_sarif`` builds a SARIF 2.1.0 log (code-scanning uploads), ``github.to_github``
builds GitHub Actions workflow-command annotations. Both render ``capturelint.findings``
records in the fixed order of ``Finding.sort_key``, and what the reporter hands in besides
(SARIF run properties, GitHub warnings: what each configuration checked).
"""

from capturelint.formats.github import to_github
from capturelint.formats.sarif import fingerprint, to_sarif

__all__ = ["fingerprint", "to_github", "to_sarif"]
