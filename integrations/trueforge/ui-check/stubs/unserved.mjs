// Stands in for a module the registry does not serve (see run.mjs). The settings tests never call
// into it; it is only imported along the way by modules they load, whose imports stay unresolved.
export {}
