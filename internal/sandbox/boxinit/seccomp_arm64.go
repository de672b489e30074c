package boxinit

const sysSeccomp = 277

// sysWaitidNum is waitid(2)'s number on this architecture.
const sysWaitidNum = 95
