"""The experiment harness: the exact sequence-level workbench (`lab`) and grids of training runs (`sweep`), with
their tables and plots. Depends on the library; the library never imports it."""
