"""docs/concepts/mechanisms.md carries the table generated from the registry (privacy map,
neighbours, audit, proof link, parameters), and every proof link lands on a section of
docs/concepts/privacy-proofs.md. A stale page fails here."""

import re
from pathlib import Path

from recsvc.mechanisms import MECHANISMS, docs, registered

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / docs.PAGE
PROOFS = REPO / "docs" / "concepts" / "privacy-proofs.md"


def _anchors(markdown: str) -> set[str]:
    """GitHub's heading anchors: lower case, backticks and punctuation dropped, spaces → '-'."""
    out = set()
    for heading in re.findall(r"^#{1,6} (.+)$", markdown, flags=re.MULTILINE):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        out.add(slug)
    return out


def test_the_mechanisms_page_table_is_generated_and_current():
    text = PAGE.read_text(encoding="utf-8")
    stale = "docs/concepts/mechanisms.md is stale: python -m recsvc.mechanisms.docs --write"
    assert docs.with_table(text) == text, stale
    assert docs.main(["--check", "--page", str(PAGE)]) == 0


def test_a_stale_page_is_detected_and_rewritten(tmp_path):
    text = PAGE.read_text(encoding="utf-8")
    stale = tmp_path / "mechanisms.md"
    stale.write_text(text.replace("| `rnm` |", "| `rnm2` |"), encoding="utf-8")
    assert docs.main(["--check", "--page", str(stale)]) == 1
    assert docs.main(["--write", "--page", str(stale)]) == 0 and stale.read_text(encoding="utf-8") == text


def test_the_table_shows_each_declaration():
    table = docs.markdown_table()
    assert len(table.splitlines()) == 2 + len(MECHANISMS)
    assert table.splitlines()[0].startswith("| name | privacy map | neighbours | audit | proof |")
    assert (
        "| `rnmh` | **∞ (NOT DP)** | \\|q_a − q′_a\\| ≤ Δ_a | none (nothing to prove) "
        "| [proof](privacy-proofs.md#rnmh) | no | float64 sampling; δ(ε) not measured | – |"
    ) in table
    assert (
        "| `gem` | ε | \\|q_a − q′_a\\| ≤ Δ_a | exact, at defaults and beta = 0.2; the loss reaches ≥ 40% of ε "
        "| [proof](privacy-proofs.md#gem) | yes | pure ε-DP, exact: sampled exactly at every ε (δ = 0) "
        "| `beta` = 0.05 in (0, 1): "
    ) in table
    assert ("| `combined_gem` | corr_budget_fraction·ε + (1 − corr_budget_fraction)·ε = ε |") in table
    assert "| `rs` | ε | \\|q_a − q′_a\\| ≤ Δ_a | statistical, at gamma = 0.05; 100,000 draws per input |" in table
    assert "| `krr` | ε | any scores |" in table
    assert "| yes | pure ε-DP, exact: sampled exactly at every ε (δ = 0) |" in table.split("| `em` |")[1].split("\n")[0]


def test_every_proof_link_lands_on_a_section():
    anchors = _anchors(PROOFS.read_text(encoding="utf-8"))
    for name, m in MECHANISMS.items():
        path, _, anchor = m.privacy.proof.partition("#")
        assert (REPO / path) == PROOFS and anchor in anchors, f"{name}: {m.privacy.proof} has no section"
    assert "what-the-service-charges" in anchors  # linked from mechanisms.md


def test_a_registered_mechanism_gets_a_row(make_toy):
    with registered(make_toy("doubler", scale=2.0, privacy_map=lambda e: 2 * e)):
        row = docs.markdown_table().splitlines()[-1]
    assert row.startswith("| `doubler` | ε ↦ 2 at ε = 1 | \\|q_a − q′_a\\| ≤ Δ_a | exact, at defaults and alpha = 1;")
    assert (
        "| [proof](privacy-proofs.md#em) | yes | float64 sampling; δ(ε) not measured | `alpha` = 0.5 in (0, 1]: " in row
    )
