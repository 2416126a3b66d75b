"""Agent environments for LLM-agent RL: text in, text out, a reward, behind one small contract (`AgentEnv`).

Importing this package registers the built-ins: `Arithmetic-v0` (one-turn arithmetic), `CalcTool-v0` (multi-turn
tool use), `LookupCalc-v0` (two tools in an episode) and `PendulumGains-v0` (gains as text, scored in MuJoCo).
"""
from rl_core.envs.agent.arithmetic import Arithmetic
from rl_core.envs.agent.calc_tool import CalcTool
from rl_core.envs.agent.contract import AgentEnv, Split, draw_problem, problem_split, split_seeds
from rl_core.envs.agent.lookup_calc import LookupCalc
from rl_core.envs.agent.pendulum_gains import PendulumGains, PlanEvaluator, evaluate_plans, parse_plan
from rl_core.envs.agent.registry import (
    agent_env_names,
    make_agent_env,
    register_agent_env,
    uses_simulator,
    validate_agent_env_name,
)

for _env in (Arithmetic, CalcTool, LookupCalc, PendulumGains):
    register_agent_env(_env, _env.name)

__all__ = [
    "AgentEnv", "Arithmetic", "CalcTool", "LookupCalc", "PendulumGains", "PlanEvaluator", "Split", "agent_env_names",
    "draw_problem", "evaluate_plans", "make_agent_env", "parse_plan", "problem_split", "register_agent_env",
    "split_seeds", "uses_simulator", "validate_agent_env_name",
]
