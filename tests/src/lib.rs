//! Client integration tests for ctxguard live in `tests/*.rs`; they need a running cluster
//! (`scripts/test.sh` starts one and sets `CTXGUARD_TEST_DATABASE_URL` and `CTXGUARD_TEST_JWT_SECRET`).
