"""A draft/target pair: model references to loaded models (`models`), and a ready-to-run `Pair` (`pipeline`)."""
