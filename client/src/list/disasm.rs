//! x86-64 disassembly of one function (iced-x86), with basic blocks and branch targets.

use std::collections::BTreeMap;

use iced_x86::{
    Decoder, DecoderOptions, FlowControl, Formatter, GasFormatter, Instruction, IntelFormatter,
};

/// `--syntax`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Syntax {
    /// AT&T, as objdump and perf annotate print by default.
    Att,
    Intel,
}

/// One decoded instruction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Insn {
    /// Virtual address.
    pub addr: u64,
    pub len: usize,
    pub text: String,
    /// First instruction of a basic block (function entry, a branch target, or the
    /// instruction after a branch or return).
    pub block_start: bool,
    /// Direct branch or call target address.
    pub target: Option<u64>,
    pub is_call: bool,
}

/// Decode `code` (mapped at `addr`) to the end. Undecodable bytes become `(bad)`, one byte
/// each, as objdump shows them.
pub fn decode(code: &[u8], addr: u64, syntax: Syntax) -> Vec<Insn> {
    let mut decoder = Decoder::with_ip(64, code, addr, DecoderOptions::NONE);
    let mut fmt: Box<dyn Formatter> = match syntax {
        Syntax::Att => Box::new(GasFormatter::new()),
        Syntax::Intel => Box::new(IntelFormatter::new()),
    };
    fmt.options_mut().set_first_operand_char_index(8);
    fmt.options_mut().set_space_after_operand_separator(false);
    fmt.options_mut().set_uppercase_hex(false);
    fmt.options_mut().set_leading_zeros(false);
    fmt.options_mut().set_branch_leading_zeros(false);
    let mut out: Vec<Insn> = Vec::with_capacity(code.len() / 4);
    let mut ins = Instruction::default();
    let mut text = String::new();
    let mut after_branch = true;
    while decoder.can_decode() {
        decoder.decode_out(&mut ins);
        let len = ins.len().max(1);
        text.clear();
        if ins.is_invalid() {
            text.push_str("(bad)");
        } else {
            fmt.format(&ins, &mut text);
        }
        let flow = ins.flow_control();
        let target = match flow {
            FlowControl::ConditionalBranch
            | FlowControl::UnconditionalBranch
            | FlowControl::Call
                if !ins.is_invalid() =>
            {
                Some(ins.near_branch_target()).filter(|&t| t != 0)
            }
            _ => None,
        };
        out.push(Insn {
            addr: ins.ip(),
            len,
            text: text.trim_end().to_owned(),
            block_start: after_branch,
            target,
            is_call: flow == FlowControl::Call,
        });
        after_branch = matches!(
            flow,
            FlowControl::ConditionalBranch
                | FlowControl::UnconditionalBranch
                | FlowControl::IndirectBranch
                | FlowControl::Return
                | FlowControl::Interrupt
                | FlowControl::Exception
        );
        if ins.is_invalid() && ins.len() == 0 {
            // iced always consumes bytes; guard against a decoder that would not.
            break;
        }
    }
    mark_targets(out)
}

/// Branch targets inside the function start blocks too.
fn mark_targets(mut v: Vec<Insn>) -> Vec<Insn> {
    let starts: BTreeMap<u64, usize> = v.iter().enumerate().map(|(i, x)| (x.addr, i)).collect();
    let targets: Vec<usize> = v
        .iter()
        .filter(|x| !x.is_call)
        .filter_map(|x| x.target.and_then(|t| starts.get(&t).copied()))
        .collect();
    for i in targets {
        v[i].block_start = true;
    }
    v
}

/// Labels `L1`, `L2`, ... for the branch targets inside the function, in address order.
pub fn labels(insns: &[Insn]) -> BTreeMap<u64, String> {
    let lo = insns.first().map_or(0, |i| i.addr);
    let hi = insns.last().map_or(0, |i| i.addr);
    let mut t: Vec<u64> = insns
        .iter()
        .filter(|x| !x.is_call)
        .filter_map(|x| x.target)
        .filter(|&a| a >= lo && a <= hi && insns.binary_search_by_key(&a, |i| i.addr).is_ok())
        .collect();
    t.sort_unstable();
    t.dedup();
    t.into_iter().enumerate().map(|(i, a)| (a, format!("L{}", i + 1))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loop_blocks_targets_and_bad_bytes() {
        // 0: xor eax,eax; 2: add eax,1; 5: cmp eax,10; 8: jne 2; a: ret; b: (bad)
        let code = [0x31, 0xc0, 0x83, 0xc0, 0x01, 0x83, 0xf8, 0x0a, 0x75, 0xf8, 0xc3, 0x06];
        let v = decode(&code, 0x1000, Syntax::Intel);
        let addrs: Vec<u64> = v.iter().map(|i| i.addr).collect();
        assert_eq!(addrs, [0x1000, 0x1002, 0x1005, 0x1008, 0x100a, 0x100b]);
        assert!(v[0].text.starts_with("xor"), "{:?}", v[0].text);
        assert_eq!(v[3].target, Some(0x1002));
        let starts: Vec<bool> = v.iter().map(|i| i.block_start).collect();
        assert_eq!(starts, [true, true, false, false, true, true]);
        assert_eq!(v[5].text, "(bad)");
        let l = labels(&v);
        assert_eq!(l.get(&0x1002).map(String::as_str), Some("L1"));
        assert_eq!(l.len(), 1);
        let att = decode(&code[..2], 0x1000, Syntax::Att);
        assert!(att[0].text.contains("%eax"), "{:?}", att[0].text);
    }
}
