package boxinit

const sysSeccomp = 317
