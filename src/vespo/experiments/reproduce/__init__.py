"""The paper's reproduction: `vespo reproduce paper` (its staleness table on the free-length task, a verdict on every
ordering it claims) and `vespo reproduce paper-long` (the same table on 128-token responses where the methods'
updates differ, with designs git can date).

Modules, one job each: `paper` (the paper's numbers, the short table's claims and verdicts), `plan` (a slice's
comparisons, Holm families, power planning and plan.md's format), `designs` (plan files written once), `registration`
(what git says about when a plan and its results were committed: confirmatory or exploratory), `slices` (a table
built in slices, merged only when every slice is this table's), `verdicts` (the long table's tests and verdicts.md),
`long` (its report and a design's run) and `command` (the command line). The presets and the regime gate they run
under are data in `vespo.experiments.presets`; the cells run through `vespo.experiments.sweep`.
"""
