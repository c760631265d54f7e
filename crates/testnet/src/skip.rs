//! The one way a test skips, and the one switch that turns skips into failures.
//!
//! A test that cannot run here calls [`skip_unless`], which prints
//! `SKIPPED <test>: <what> - <why>` and returns `false` (the test then returns), or panics
//! when `TUNNELD_REQUIRE_ALL=1` (set by `.ci/run`). The rule under that switch: a skip is
//! allowed only for a fact of the hardware that the test checks itself ([`Missing::Hardware`]:
//! cpuid says there is no AVX-512); missing software, privileges, kernel features or set-up
//! ([`Missing::Setup`]) fail, because the machine is meant to run everything and a skip there
//! would hide a test that silently stopped running.

/// The switch: `TUNNELD_REQUIRE_ALL=1` makes every skip but a hardware one a failure.
pub const REQUIRE_ALL: &str = "TUNNELD_REQUIRE_ALL";

/// Why a test cannot run, which decides whether `TUNNELD_REQUIRE_ALL=1` lets it skip.
#[derive(Debug, Clone, Copy)]
pub enum Missing<'a> {
    /// Software, privileges, a kernel feature or set-up: a failure under the switch.
    Setup(&'a str),
    /// A fact of this CPU or device the test has checked itself: skipped even under the
    /// switch, since no machine of the kind CI runs on can be asked to have it.
    Hardware(&'a str),
}

/// Whether every skip but a hardware one must fail (`TUNNELD_REQUIRE_ALL=1`).
pub fn all_required() -> bool {
    std::env::var(REQUIRE_ALL).as_deref() == Ok("1")
}

/// `true` when `ready`. Otherwise says that `test` skips `what` and why, and returns `false`;
/// panics instead under `TUNNELD_REQUIRE_ALL=1` unless what is missing is hardware.
#[track_caller]
pub fn skip_unless(test: &str, ready: bool, what: &str, missing: Missing<'_>) -> bool {
    match decide(ready, all_required(), test, what, missing) {
        Decision::Run => true,
        Decision::Skip(line) => {
            eprintln!("{line}");
            false
        }
        Decision::Fail(message) => panic!("{message}"),
    }
}

#[derive(Debug, PartialEq)]
enum Decision {
    Run,
    Skip(String),
    Fail(String),
}

fn decide(ready: bool, required: bool, test: &str, what: &str, missing: Missing<'_>) -> Decision {
    match missing {
        _ if ready => Decision::Run,
        Missing::Setup(why) if required => Decision::Fail(format!(
            "{test}: cannot run {what} - {why} ({REQUIRE_ALL}=1: only a fact of the hardware may skip)"
        )),
        Missing::Setup(why) | Missing::Hardware(why) => {
            Decision::Skip(format!("SKIPPED {test}: {what} - {why}"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_runs_whatever_the_switch() {
        for required in [false, true] {
            let setup = decide(true, required, "t", "x", Missing::Setup("y"));
            assert_eq!(setup, Decision::Run);
        }
    }

    #[test]
    fn a_missing_setup_skips_with_its_reason_or_fails_under_the_switch() {
        assert_eq!(
            decide(
                false,
                false,
                "t",
                "the netns test",
                Missing::Setup("not root")
            ),
            Decision::Skip("SKIPPED t: the netns test - not root".into())
        );
        assert_eq!(
            decide(
                false,
                true,
                "t",
                "the netns test",
                Missing::Setup("not root")
            ),
            Decision::Fail(
                "t: cannot run the netns test - not root (TUNNELD_REQUIRE_ALL=1: only a fact \
                 of the hardware may skip)"
                    .into()
            )
        );
    }

    #[test]
    fn missing_hardware_skips_even_under_the_switch() {
        for required in [false, true] {
            assert_eq!(
                decide(
                    false,
                    required,
                    "t",
                    "the 44-bit lanes",
                    Missing::Hardware("no IFMA")
                ),
                Decision::Skip("SKIPPED t: the 44-bit lanes - no IFMA".into())
            );
        }
    }
}
