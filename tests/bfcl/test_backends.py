"""Backends: per-episode instances, dispatch by name, BFCL's exact result and error text."""

from __future__ import annotations

import uuid

import pytest
from trace_gym.envs.bfcl.backends import execute_call, make_backends, method_table
from trace_gym.envs.bfcl.data import get_entry, load_entries
from trace_gym.envs.bfcl.parsing import Call, parse_python_calls

# per backend class: good calls, unknown functions, bad arguments, backend errors
CALLS = {
    "GorillaFileSystem": [
        "cd(folder='document')",
        "cd(folder='nowhere')",
        "mkdir(dir_name='temp')",
        "mkdir(dir_name='temp')",
        "ls()",
        "ls(a=True)",
        "cd()",
        "cd(folder='x', extra=1)",
        "teleport(to='x')",
        "pwd()",
        "touch(file_name='n.txt')",
        "echo(content='hello', file_name='n.txt')",
        "cat(file_name='n.txt')",
        "wc(file_name='n.txt', mode='bogus')",
        "exit()",
        "GorillaFileSystem.ls()",
        "find(path='.', name='n')",
    ],
    "TradingBot": [
        "get_stock_info(symbol='AAPL')",
        "get_stock_info(symbol='NOPE')",
        "get_stock_info()",
        "get_watchlist()",
        "place_order(order_type='Buy', symbol='AAPL', price=1.0, amount=3)",
        "get_current_time()",
    ],
    "MathAPI": [
        "add(a=1, b=2)",
        "divide(a=1, b=0)",
        "mean(numbers=[])",
        "square_root(number=2, precision=5)",
        "logarithm(value=8, base=2, precision=3)",
    ],
    "VehicleControlAPI": [
        "displayCarStatus(option='fuel')",
        "get_outside_temperature_from_google()",
        "startEngine(ignitionMode='START')",
        "lockDoors(unlock=False, door=['driver'])",
        "fillFuelTank(fuelAmount=-5)",
        "estimate_drive_feasibility_by_mileage(distance=10.0)",
    ],
    "TravelAPI": [
        "get_credit_card_balance(access_token='x', card_id='y')",
        "list_all_airports()",
        "get_budget_fiscal_year()",
    ],
    "MessageAPI": [
        "list_users()",
        "message_login(user_id='USR001')",
        "send_message(receiver_id='USR002', message='hi')",
        "view_messages_sent()",
    ],
    "TwitterAPI": [
        "get_user_tweets(username='x')",
        "post_tweet(content='hi')",
        "authenticate_twitter(username='a', password='b')",
    ],
    "TicketAPI": [
        "get_user_tickets()",
        "create_ticket(title='t')",
        "ticket_login(username='u', password='p')",
    ],
}


def _entries():
    picked = []
    for cls in CALLS:
        for category in ("base", "long_context"):
            entry = next(e for e in load_entries((category,)) if cls in e.involved_classes)
            picked.append(pytest.param(entry.id, cls, id=f"{cls}-{category}"))
    return picked


@pytest.mark.parametrize(("entry_id", "cls"), _entries())
def test_results_and_errors_match_bfcl_executor_exactly(entry_id, cls):
    from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_utils import execute_multi_turn_func_call

    entry = get_entry(entry_id)
    calls = CALLS[cls]
    theirs, _ = execute_multi_turn_func_call(
        calls,
        entry.initial_config,
        list(entry.involved_classes),
        f"trace_gym_{uuid.uuid4().hex}",
        entry.id,
        long_context=entry.long_context,
        is_evaL_run=True,
    )
    backends = make_backends(entry)
    table = method_table(entry.involved_classes)
    ours = [
        execute_call(backends, c, table).result for text in calls for c in parse_python_calls(text)
    ]
    assert ours == theirs
    assert sum(not r.startswith("Error during execution") for r in ours) >= 1


def test_statuses_classify_failures():
    entry = get_entry("multi_turn_base_0")
    backends, table = make_backends(entry), method_table(entry.involved_classes)
    status = {
        text: execute_call(backends, parse_python_calls(text)[0], table).status
        for text in ["ls()", "teleport(x=1)", "cd(bogus=1)", "exit()", "cd(folder='nowhere')"]
    }
    assert status == {
        "ls()": "ok",
        "teleport(x=1)": "unknown_function",
        "cd(bogus=1)": "bad_arguments",
        "exit()": "refused",
        "cd(folder='nowhere')": "ok",
    }


def test_expensive_math_is_refused_instead_of_hanging():
    entry = next(e for e in load_entries(("base",)) if "MathAPI" in e.involved_classes)
    backends, table = make_backends(entry), method_table(entry.involved_classes)
    res = execute_call(backends, Call("power", (), {"base": 10, "exponent": 10**9}), table)
    assert res.status == "refused" and res.result.startswith("Error during execution: ")
    assert (
        execute_call(backends, Call("power", (), {"base": 2, "exponent": 10}), table).result
        == '{"result": 1024}'
    )


def test_episode_backends_are_fresh_and_never_in_bfcl_global_cache(bfcl_env):
    from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils

    before = {k for k in vars(multi_turn_utils) if k.endswith("_instance")}
    bfcl_env.reset(options={"task": "multi_turn_base_0"})
    bfcl_env.step("[mkdir(dir_name='fresh_dir')]")
    fs = bfcl_env._backends["GorillaFileSystem"]
    bfcl_env.reset(options={"task": "multi_turn_base_0"})
    assert bfcl_env._backends["GorillaFileSystem"] is not fs
    assert "fresh_dir" not in str(bfcl_env._backends["GorillaFileSystem"].root)
    assert {k for k in vars(multi_turn_utils) if k.endswith("_instance")} == before
