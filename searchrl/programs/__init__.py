"""searchrl.programs: Retrieval Program Learning's program language and the sandbox that runs it.

    result = execute(source, sdk)  # never raises for any source
    result.shown  # the hits the program showed, in order
    result.error  # None, or "<rule or limit>: <detail> (line L, column C)"

Programs are untrusted input (the policy writes them): they are parsed with `ast`, checked against an
allow-list (`language`) and run by the project's own tree-walking interpreter (`sandbox`), never by Python's
eval, exec or compile.
"""
from searchrl.programs.language import FUNCTIONS, RULES, ProgramError
from searchrl.programs.limits import Limits
from searchrl.programs.sandbox import ProgramResult, execute

__all__ = ["execute", "Limits", "ProgramResult", "ProgramError", "FUNCTIONS", "RULES"]
