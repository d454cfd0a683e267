"""The launch read from raw step stamps (`profiles.diag_launch`), on hand-built steps."""

from profiles.diag_launch import by_size, launches


def _step(t_sched, t_done, nd, prompts=()):
    return {
        "t_sched": t_sched,
        "t_done": t_done,
        "nd": nd,
        "pf": [[f"r{n}", n, 0] for n in prompts],
    }


def test_a_launch_is_the_decode_steps_output_after_the_prompt_steps_plan():
    steps = [
        _step(0.000, 0.010, 4),  # decode; the next plans 5 ms later: a launch of 0.010 - 0.005
        _step(0.005, 0.013, 4, [2000]),
        _step(0.013, 0.020, 5),  # decode followed by a prompt planned 40 ms later: not a launch
        _step(0.053, 0.060, 5, [100]),
        _step(0.060, 0.090, 0, [3000]),  # a prompt step behind a prompt step: not counted
        _step(0.091, 0.200, 6),  # decode, then a prompt step planned 10 ms later
        _step(0.101, 0.210, 2, [5000, 1000]),
    ]
    assert launches(steps) == [(2004, 0.010 - 0.005), (6002, 0.200 - 0.101)]
    rows = by_size(launches(steps))
    assert [(r["tokens"], r["n"]) for r in rows] == [("1025-4096", 1), ("4097-8192", 1)]
    assert abs(rows[0]["p50"] - 5.0) < 1e-9 and abs(rows[1]["p50"] - 99.0) < 1e-9


def test_a_prompt_step_planned_after_the_decode_step_returned_is_no_launch():
    steps = [_step(0.000, 0.010, 4), _step(0.012, 0.030, 4, [2000])]
    assert launches(steps) == []


def test_launches_are_summarised_per_engine_process_graph_and_eager_apart():
    """Rows tagged with their process (`read_steps` of several files) are split by it; a run
    archived without tags splits at a restart-long idle gap (`RESTART_GAP_S`)."""
    from profiles.diag_launch import launches_by_process

    first = [
        _step(0.000, 0.010, 4),
        _step(0.004, 0.020, 4, [100]),  # graph launch 6 ms
        _step(0.020, 0.050, 4),
        _step(0.030, 0.090, 4, [2000]),
    ]  # eager launch 20 ms
    second = [_step(60.0, 60.010, 4), _step(60.002, 60.040, 4, [3000])]  # eager 8 ms, after 60 s
    got = launches_by_process(first + second, graph_max=512)
    assert [p["steps"] for p in got] == [4, 2]
    assert got[0]["graph"] == {"launches": 1, "p50_ms": 6.0}
    assert got[0]["eager"] == {"launches": 1, "p50_ms": 20.0}
    assert got[1]["graph"] == {"launches": 0, "p50_ms": None}
    assert got[1]["eager"] == {"launches": 1, "p50_ms": 8.0}
    # tagged rows win over gaps: all in one process although 60 s apart
    tagged = [{**s, "proc": 0} for s in first + second]
    assert [p["steps"] for p in launches_by_process(tagged, graph_max=512)] == [6]


def test_launches_are_grouped_by_the_decodes_running_beside_them():
    """`by_decodes` reads only launched steps of 1,025-4,096 tokens and groups them by the
    launching decode step's ``nd``: 4 and 6 decodes share the 1-8 range (median of 10 and 20
    ms), 200 decodes fall in 129-512; a 6,000-token launch is left out."""
    from profiles.diag_launch import by_decodes, launches_behind

    steps = [
        _step(0.000, 0.015, 4), _step(0.005, 0.020, 4, [2000]),  # 10 ms behind 4 decodes
        _step(0.100, 0.125, 6), _step(0.105, 0.130, 6, [3000]),  # 20 ms behind 6
        _step(0.200, 0.250, 200), _step(0.210, 0.260, 200, [1500]),  # 40 ms behind 200
        _step(0.300, 0.390, 200), _step(0.310, 0.400, 200, [6000]),  # 6,200 tokens: not read
    ]  # fmt: skip
    found = launches_behind(steps)
    assert [(n, nd) for n, nd, _ in found] == [(2004, 4), (3006, 6), (1700, 200), (6200, 200)]
    rows = by_decodes(found)
    assert [(r["decodes"], r["n"]) for r in rows] == [("1-8", 2), ("129-512", 1)]
    assert abs(rows[0]["p50"] - 15.0) < 1e-9 and abs(rows[1]["p50"] - 40.0) < 1e-9


def test_launches_are_split_by_the_family_of_the_launched_step():
    """`by_family` names each launch by its prompt step's first request (``arrive_b8_c1024/3``
    -> ``arrive``) and groups each family's launches by the decodes beside them: the two
    ``arrive`` launches (10 and 30 ms behind 4 and 8 decodes) share the 1-8 range, the
    ``inject`` one (40 ms behind 200) falls in 129-512."""
    from profiles.diag_launch import by_family, family

    def step(t_sched, t_done, nd, rid=None):
        return {"t_sched": t_sched, "t_done": t_done, "nd": nd,
                "pf": [[rid, 2000, 0]] if rid else []}  # fmt: skip

    steps = [
        step(0.000, 0.015, 4), step(0.005, 0.020, 4, "arrive_b8_c1024/3"),
        step(0.100, 0.135, 8), step(0.105, 0.140, 8, "arrive_b8_c1024~r1/0"),
        step(0.200, 0.250, 200), step(0.210, 0.260, 200, "inject_b192_c1024/1"),
    ]  # fmt: skip
    assert family(steps[1]) == "arrive" and family({"pf": [["conv_light/17", 5, 0]]}) == "conv"
    got = by_family(steps)
    assert list(got) == ["arrive", "inject"]
    assert [(r["decodes"], r["n"]) for r in got["arrive"]] == [("1-8", 2)]
    assert abs(got["arrive"][0]["p50"] - 20.0) < 1e-9
    assert [(r["decodes"], r["n"]) for r in got["inject"]] == [("129-512", 1)]
    assert abs(got["inject"][0]["p50"] - 40.0) < 1e-9
