package boxinit

const sysSeccomp = 317

// sysWaitidNum is waitid(2)'s number on this architecture.
const sysWaitidNum = 247
