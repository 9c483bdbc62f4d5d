//! docs/benchmarks.md's figures are those of kept runs: each block of the page that
//! starts `<!-- rendered from docs/bench/NAME.json -->` is what the bench's own report
//! (benches/trainlet/report.rs) renders from that file, so no figure there is typed by
//! hand or left from an older run. `make bench-docs` (`TRAINLET_WRITE_DOCS=1`) writes
//! the blocks anew after a run is copied into docs/bench/.

#[path = "../../benches/trainlet/report.rs"]
#[allow(dead_code)]
mod report;

use crate::support::repo;

#[test]
fn the_figures_of_docs_benchmarks_md_are_rendered_from_the_kept_runs() {
    let page = repo().join("docs/benchmarks.md");
    let doc = std::fs::read_to_string(&page).unwrap();
    let rendered = report::render_blocks(&doc, report::load_kept).unwrap();
    if std::env::var_os("TRAINLET_WRITE_DOCS").is_some() {
        std::fs::write(&page, &rendered).unwrap();
        return;
    }
    assert!(
        doc.contains("<!-- rendered from docs/bench/"),
        "docs/benchmarks.md has no rendered block"
    );
    assert!(
        doc == rendered,
        "docs/benchmarks.md differs from its kept runs: run `make bench-docs`"
    );
}

#[test]
fn every_kept_run_is_rendered_and_says_how_it_was_made() {
    let doc = std::fs::read_to_string(repo().join("docs/benchmarks.md")).unwrap();
    for entry in std::fs::read_dir(repo().join("docs/bench")).unwrap() {
        let name = entry.unwrap().file_name().into_string().unwrap();
        if !name.ends_with(".json") {
            continue;
        }
        assert!(
            doc.contains(&format!("<!-- rendered from docs/bench/{name} -->")),
            "docs/bench/{name} is kept but docs/benchmarks.md renders nothing from it"
        );
        let run = report::load_kept(&name).unwrap();
        for key in ["machine", "commit", "command"] {
            assert!(
                run[key].as_str().is_some_and(|s| !s.is_empty()),
                "docs/bench/{name} has no {key}"
            );
        }
    }
}

#[test]
fn ratios_keep_two_significant_digits() {
    assert_eq!(report::ratio(0.00612), "0.0061×");
    assert_eq!(report::ratio(0.17), "0.17×");
    assert_eq!(report::ratio(1.5), "1.50×");
    assert_eq!(report::ratio(23.04), "23.04×");
}
