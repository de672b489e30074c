package boxinit

const sysSeccomp = 277
