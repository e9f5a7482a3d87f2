"""The GPU domain: what a GPU reading is (model) and the one judgement of it (health).
Pure values: no I/O."""
