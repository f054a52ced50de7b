"""Hand-written models of what a user's own code may do that the fold's checks do not see (two probes of
2026-12-04, issue 24): each of these folded and was NOT the same as its full trace when the fold was asked for
(TrainConfig.fold_own_code), and each is traced in full by default (engine.trace.fold_known: the user's own code),
so exact. `loops.py`: how the model's code goes through the stack and what it carries; `state_*.py`: state a block
acts on from its own code. `python -m benchmarks.fold_probes [--write]` runs them all both ways
(benchmarks/RESULTS.md, "The user's own code is traced in full"). The files are kept as the probes wrote them."""

# the models of each file that folded wrongly (the files hold a few that declined or folded exactly too)
PROBES: dict[str, tuple[str, ...]] = {
    "loops": (),  # (every M_ class of the file)
    "state_1": ('M_TypeCls', 'M_DunderCls', 'M_Append', 'M_Update', 'M_Helper', 'M_SysMod', 'M_Setattr',),
    "state_2": ('M_Count', 'M_CtrObj', 'M_Cycle', 'M_PrivList', 'M_Prop',),
    "state_3": ('M_ClsList', 'M_LayerDrop', 'M_LayerDropExtra', 'M_Memo2', 'M_Next', 'M_ParentHelper',),
    "state_4": ('M_Decorated', 'M_Descr', 'M_EnvUpdate', 'M_FeatsLen', 'M_GetAttr', 'M_MutDefault', 'M_Registry',
                'M_TypeIs',),
    "state_6": ('M_CtxVar', 'M_SharedDeque', 'M_SharedHeap', 'M_SharedIter', 'M_SharedRng',),
    "state_7": ('M_CtxDictList', 'M_CtxObj', 'M_CtxOwnClass', 'M_TensorAttr',),
    "state_8": ('M_Alias', 'M_ClsMethod', 'M_PassGlobal', 'M_PropStore', 'M_Static',),
    "state_10": ('M_RefCounting', 'M_RefNorm',),
    "state_11": ('M_Closure', 'M_DC', 'M_LambdaDefault', 'M_Partial',),
    "state_12": ('M_Deep', 'M_NestedNS', 'M_Set',),
    "state_13": ('M_HookNext',),
    "state_14": ('M_OwnHooks',),}
