"""The same gate in the project's own test suite (pytest, with capturelint installed):
the plugin's capturelint_check fixture reads pyproject.toml, so it checks our targets."""


def test_replay_matches_eager(capturelint_check):
    capturelint_check.assert_clean()
