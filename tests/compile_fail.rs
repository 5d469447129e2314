//! The gate's guarantee, as compile errors: a permit cannot be forged, a
//! call cannot be dispatched without its intent line nor twice on one, and
//! neither an action, a held call nor an audit line can be built by hand;
//! nothing outside the crate reaches the code that spawns a tool.

#[test]
fn bypassing_the_gate_does_not_compile() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/compile-fail/*.rs");
}
