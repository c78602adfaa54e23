"""A compare run's output, told apart: with workers, every line it prints starts with its label on the terminal,
a redrawn progress line becomes a line of its own at most every so often, and every line goes to run.log in the
run's folder; with one worker the terminal gets what the run wrote, unchanged."""

import io
import sys

from trace_rl.commands.run_log import LOG, RunLog, RunStream, run_output


class Tty(io.StringIO):
    def isatty(self):
        return True


def test_labelled_lines_on_the_terminal_and_plain_ones_in_the_log(tmp_path):
    term, now = io.StringIO(), iter([0.0, 10.0, 40.0, 50.0, 0.0, 5.0])
    log = RunLog(tmp_path / LOG, "trace seed100")
    stream = RunStream(term, log, "[trace seed100] ", redraw_every=30.0, clock=lambda: next(now))
    stream.write("== trace, seed 100 (run 1 of 2)\nstep 1/2  er 0.500")
    stream.write("  about 5s left\n")
    # a bar redrawn: shown 30 s after it began (at 40 s), not before, not 10 s after that; a short one: never
    stream.write("\reval  10%| 1/10\reval  50%| 5/10\reval  80%| 8/10\reval  90%| 9/10\r      \r")
    stream.write("\rtrain 1/2\rtrain 2/2\r     \r")
    stream.write("held-out accuracy on 2 tasks x 2 samples: 0.500 ± 0.100")
    stream.finish()
    log.close()
    assert term.getvalue().splitlines() == [
        "[trace seed100] == trace, seed 100 (run 1 of 2)",
        "[trace seed100] step 1/2  er 0.500  about 5s left",
        "[trace seed100] eval  80%| 8/10",
        "[trace seed100] held-out accuracy on 2 tasks x 2 samples: 0.500 ± 0.100",
    ]
    logged = (tmp_path / LOG).read_text().splitlines()
    assert logged[0].startswith("--- ") and logged[0].endswith(" trace seed100")  # when this session began
    assert logged[1:] == [line.removeprefix("[trace seed100] ") for line in term.getvalue().splitlines()]
    assert not stream.isatty()  # labelled: tqdm draws no terminal bar into it


def test_one_worker_passes_the_text_through_and_still_logs_lines(tmp_path):
    term = Tty()
    log = RunLog(tmp_path / LOG, "grpo seed0")
    stream = RunStream(term, log, None)
    stream.write("\rstep 1/2 er 0.5\rstep 2/2 er 0.4\n")
    log.close()
    assert term.getvalue() == "\rstep 1/2 er 0.5\rstep 2/2 er 0.4\n"  # exactly what was written
    assert (tmp_path / LOG).read_text().splitlines()[1:] == ["step 2/2 er 0.4"]  # the line the newline ended
    assert stream.isatty()  # the terminal's own answer, so bars draw as without the log


def test_lines_before_the_run_folder_exists_wait_and_a_refused_run_leaves_no_log(tmp_path):
    run = tmp_path / "grpo" / "seed0"
    with run_output(run, "grpo seed0", labelled=True):
        print("checking")
        run.mkdir(parents=True)
        print("== grpo, seed 0", file=sys.stderr)
    assert (run / LOG).read_text().splitlines()[1:] == ["checking", "== grpo, seed 0"]
    never = tmp_path / "trace" / "seed0"
    with run_output(never, "trace seed0", labelled=False):
        print("refused")
    assert not never.exists()
    assert sys.stdout is not None and not isinstance(sys.stdout, RunStream)  # restored
