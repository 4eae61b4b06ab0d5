//! Table tests of the lifecycle core: one per row of CONTRACT.md §3 and per retry flag.
