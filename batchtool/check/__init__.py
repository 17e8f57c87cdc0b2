"""`batchtool check`: rules a dataset must satisfy before training, checked in one streaming pass."""

from batchtool.check.evaluate import CheckOptions, check
from batchtool.check.report import CheckResult, Offender, RuleResult, junit_xml, render_text, to_json
from batchtool.check.rule_sources import load_rules, rules_from_flags
from batchtool.check.rules import KINDS, Rule, RuleSet

__all__ = ["KINDS", "CheckOptions", "CheckResult", "Offender", "Rule", "RuleResult", "RuleSet", "check",
           "junit_xml", "load_rules", "render_text", "rules_from_flags", "to_json"]
